// A small stack of the zoo's transformer layers with dropout, run through a loss, for the nn layer's tests of what
// runs around a layer's calls (activation checkpointing, activation offloading): the loss, the input's and every
// parameter's gradient, and where the random stream was left, compared exactly between two ways of running it.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::testing {

constexpr int64_t kDim = 32, kLayers = 4;

// A plain parent that runs its layers through typed members.
struct StackImpl : nn::Interceptable<StackImpl, at::Tensor(at::Tensor, at::Tensor)> {
  explicit StackImpl(double dropout, int64_t layers = kLayers) {
    models::TransformerLayerOptions o;
    o.class_name = "Layer";
    o.attention.dim = kDim;
    o.attention.heads = 4;
    o.attention.dropout = dropout;
    o.mlp_dim = 4 * kDim;
    o.dropout = dropout;
    for (int64_t i = 0; i < layers; ++i) {
      this->layers.push_back(register_module("layers" + std::to_string(i), models::TransformerLayer(o, torch::TensorOptions())));
    }
  }
  // x (B, T, C), bias (B, 1, 1, T) -> (B, T, C)
  at::Tensor forward_impl(at::Tensor x, at::Tensor bias) {
    for (auto& layer : layers) x = layer->forward(x, bias, {}, {}, {}, 0);
    return x;
  }
  std::vector<models::TransformerLayer> layers;
};
TORCH_MODULE(Stack);

struct Result {
  double loss = 0;
  at::Tensor x_grad;
  std::vector<at::Tensor> grads;
  at::Tensor next_random;  // a draw after backward: where the random stream was left
};

inline Result run(Stack& stack, const at::Tensor& x_value, const at::Tensor& bias) {
  stack->zero_grad();
  at::Tensor x = x_value.clone().requires_grad_(true);
  torch::manual_seed(11);
  at::Tensor loss = stack(x, bias).pow(2).mean();
  loss.backward();
  Result r;
  r.loss = loss.item<double>();
  r.x_grad = x.grad().clone();
  for (const auto& p : stack->parameters()) r.grads.push_back(p.grad().clone());
  r.next_random = torch::rand({4});
  return r;
}

inline Stack make_stack(double dropout, int64_t layers = kLayers) {
  torch::manual_seed(3);
  Stack stack(dropout, layers);
  models::init_parameters(*stack, "", models::WeightInitOptions{.seed = 3, .std = 0.1});
  stack->train();
  return stack;
}

inline void expect_same(const Result& a, const Result& b) {
  EXPECT_DOUBLE_EQ(a.loss, b.loss);
  EXPECT_TRUE(torch::equal(a.x_grad, b.x_grad)) << (a.x_grad - b.x_grad).abs().max().item<double>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a.grads[i], b.grads[i], 0, 0)) << "parameter " << i;
  }
  EXPECT_TRUE(torch::equal(a.next_random, b.next_random));
}

inline at::Tensor padding_bias_for(int64_t batch, int64_t length) {
  at::Tensor mask = torch::ones({batch, length});
  mask.index_put_({0, torch::indexing::Slice(length - 3)}, 0);  // the first sample has 3 padded positions
  return models::padding_bias(mask, torch::kFloat);
}

}  // namespace shardtrain::testing
