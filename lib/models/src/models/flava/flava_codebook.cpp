#include "shardtrain/models/flava_codebook.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "shardtrain/models/losses.h"

namespace shardtrain::models {

namespace {

std::shared_ptr<torch::nn::Module> child(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

}  // namespace

CodebookBlockImpl::CodebookBlockImpl(int64_t in_size, int64_t out_size, int64_t num_layers,
                                     const torch::TensorOptions& t)
    : post_gain(1.0 / static_cast<double>(num_layers * num_layers)) {
  if (in_size != out_size) id_path = register_module("id_path", Conv2d(in_size, out_size, 1, 1, 0, t));
  const int64_t hidden = out_size / 4;
  auto path = child(*child(*this, "res_path"), "path");
  conv_1 = path->register_module("conv_1", Conv2d(in_size, hidden, 3, 1, 1, t));
  conv_2 = path->register_module("conv_2", Conv2d(hidden, hidden, 3, 1, 1, t));
  conv_3 = path->register_module("conv_3", Conv2d(hidden, hidden, 3, 1, 1, t));
  conv_4 = path->register_module("conv_4", Conv2d(hidden, out_size, 1, 1, 0, t));
}

at::Tensor CodebookBlockImpl::forward(const at::Tensor& x) {
  at::Tensor r = conv_1->forward(at::relu(x));
  r = conv_2->forward(at::relu(r));
  r = conv_3->forward(at::relu(r));
  r = conv_4->forward(at::relu(r));
  return (id_path ? id_path->forward(x) : x) + post_gain * r;
}

FlavaCodebookImpl::FlavaCodebookImpl(const CodebookConfig& c, const torch::TensorOptions& t)
    : Interceptable("FlavaImageCodebook"), config(c) {
  auto blocks = child(*this, "blocks");
  const int64_t h = c.hidden_size, num_layers = 4 * c.blocks_per_group;
  input = blocks->register_module("input", Conv2d(c.channels, h, 7, 1, 3, t));
  const int64_t sizes[5] = {h, h, 2 * h, 4 * h, 8 * h};
  for (int g = 1; g <= 4; ++g) {
    auto group = child(*child(*blocks, "group_" + std::to_string(g)), "group");
    groups.emplace_back();
    for (int64_t b = 1; b <= c.blocks_per_group; ++b) {
      const int64_t in_size = b == 1 ? sizes[g - 1] : sizes[g];
      groups.back().push_back(
          group->register_module("block_" + std::to_string(b), CodebookBlock(in_size, sizes[g], num_layers, t)));
    }
  }
  output = child(*blocks, "output")->register_module("conv", Conv2d(8 * h, c.vocab_size, 1, 1, 0, t));
  for (auto& p : parameters()) p.set_requires_grad(false);
}

at::Tensor FlavaCodebookImpl::logits(const at::Tensor& pixels) { return output->forward(features(pixels)); }

at::Tensor FlavaCodebookImpl::features(const at::Tensor& pixels) {
  if (pixels.dim() != 4 || pixels.size(1) != config.channels || pixels.size(2) % 8 || pixels.size(3) % 8) {
    throw std::invalid_argument("codebook: pixels must be (batch, " + std::to_string(config.channels) +
                                ", H, W) with H, W multiples of 8, got " + c10::str(pixels.sizes()));
  }
  // Channels-last (N, H, W, C in memory): oneDNN's convolutions take it without reordering each input and output,
  // 8-14% of the codebook's time on CPU (one and two threads, measured 2026-11-24); every op below keeps it.
  at::Tensor x = input->forward(pixels.contiguous(at::MemoryFormat::ChannelsLast));
  for (size_t g = 0; g < groups.size(); ++g) {
    for (auto& block : groups[g]) x = block->forward(x);
    if (g < 3) x = at::max_pool2d(x, {2, 2});
  }
  return at::relu(x);
}

at::Tensor FlavaCodebookImpl::tokens(const at::Tensor& pixels, const at::Tensor& positions) {
  at::NoGradGuard no_grad;  // before the interceptors: a sharded codebook reshards as soon as it has computed
  return forward(pixels, positions);
}

at::Tensor FlavaCodebookImpl::forward_impl(const at::Tensor& pixels, const at::Tensor& positions) {
  at::NoGradGuard no_grad;
  const at::Tensor x = pixels.to(input->weight.scalar_type());
  if (!positions.defined()) return logits(x).argmax(1).flatten(1);
  const int64_t b = x.size(0), grid = (x.size(2) / 8) * (x.size(3) / 8);
  if (positions.scalar_type() != at::kBool || positions.sizes() != at::IntArrayRef{b, grid}) {
    throw std::invalid_argument("codebook: positions must be (" + std::to_string(b) + ", " + std::to_string(grid) +
                                ") bool, got " + c10::str(positions.sizes()) + " " +
                                std::string(c10::toString(positions.scalar_type())));
  }
  const at::Tensor f = features(x);                                         // (B, C, h, w), channels-last
  const at::Tensor rows = f.permute({0, 2, 3, 1}).reshape({b * grid, f.size(1)});  // (B h w, C): a view
  const at::Tensor chosen = positions.reshape({-1}).nonzero().squeeze(1);
  // The 1x1 convolution as a product over the chosen rows: (K, C) x (C, vocab).
  const at::Tensor logits = at::linear(rows.index_select(0, chosen), output->weight.flatten(1), output->bias);
  at::Tensor out = at::full({b * grid}, kIgnoreIndex, x.options().dtype(at::kLong));
  out.index_copy_(0, chosen, logits.argmax(1));
  return out.view({b, grid});
}

}  // namespace shardtrain::models
