// The small models the fully_shard tests train (header-only, test code).
#pragma once

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "shardtrain/nn/intercept.h"

namespace shardtrain::fsdp::testing_models {

constexpr int64_t kIn = 6, kDim = 10, kHidden = 26, kOut = 3, kBatch = 12, kSteps = 4;

struct BlockImpl : nn::Interceptable<BlockImpl, at::Tensor(at::Tensor)> {
  BlockImpl() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
  }
  at::Tensor forward_impl(at::Tensor x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct ToyImpl : nn::Interceptable<ToyImpl, at::Tensor(at::Tensor)> {
  ToyImpl() {
    in = register_module("in", torch::nn::Linear(kIn, kDim));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("blocks" + std::to_string(i), Block()));
    head = register_module("head", torch::nn::Linear(kDim, kOut));
    offset = register_buffer("offset", torch::zeros({kOut}));
  }
  at::Tensor forward_impl(at::Tensor x) {
    at::Tensor h = in(x);
    for (int pass = 0; pass < passes; ++pass) {
      for (int i = 0; i < active_blocks; ++i) h = blocks[i](h);
    }
    return head(h) + offset;
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<Block> blocks;
  at::Tensor offset;      // a buffer (zero unless a test sets it)
  int active_blocks = 3;  // forward runs the first active_blocks blocks (a model whose path varies)
  int passes = 1;         // ... this many times over (each block called `passes` times in one forward)
};
TORCH_MODULE(Toy);

// A wider model for memory measurements: sizes dominate the padding.
struct WideBlockImpl : nn::Interceptable<WideBlockImpl, at::Tensor(at::Tensor)> {
  WideBlockImpl() {
    up = register_module("up", torch::nn::Linear(64, 256));
    down = register_module("down", torch::nn::Linear(256, 64));
  }
  at::Tensor forward_impl(at::Tensor x) { return x + down(torch::relu(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(WideBlock);

struct WideImpl : nn::Interceptable<WideImpl, at::Tensor(at::Tensor)> {
  WideImpl() {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("blocks" + std::to_string(i), WideBlock()));
  }
  at::Tensor forward_impl(at::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x;
  }
  std::vector<WideBlock> blocks;
};

// The batches of every step, the same on every rank.
inline std::vector<std::pair<at::Tensor, at::Tensor>> make_batches() {
  torch::manual_seed(7);
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int s = 0; s < kSteps; ++s) batches.emplace_back(torch::randn({kBatch, kIn}), torch::randn({kBatch, kOut}));
  return batches;
}

}  // namespace shardtrain::fsdp::testing_models
