// The frozen image tokenizer of FLAVA's masked image modelling: the DALL-E dVAE encoder's architecture (Ramesh et
// al.), as Hugging Face's FlavaImageCodebook — a 7x7 input convolution, four groups of residual blocks (the first
// three end in 2x max-pooling), then a 1x1 convolution to `vocab_size` logits per position. Module names mirror
// Hugging Face's ("blocks.group_2.group.block_1.res_path.path.conv_3"), so its weights load from the same file.
// Parameters never require gradients.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <vector>

#include "shardtrain/models/build.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::models {

struct CodebookConfig {
  int64_t hidden_size = 256;
  int64_t blocks_per_group = 2;
  int64_t vocab_size = 8192;
  int64_t channels = 3;
};

class CodebookBlockImpl : public torch::nn::Module {
 public:
  CodebookBlockImpl(int64_t in_size, int64_t out_size, int64_t num_layers, const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);
  Conv2d id_path{nullptr};  // 1x1 when in_size != out_size, else the identity
  Conv2d conv_1{nullptr}, conv_2{nullptr}, conv_3{nullptr}, conv_4{nullptr};
  double post_gain;
};
TORCH_MODULE(CodebookBlock);

// Class "FlavaImageCodebook" (Hugging Face's): FLAVA's recipe makes it an FSDP unit of its own, gathered only
// while it computes tokens (models/recipe.h: ModelRecipe::extra_unit_classes).
class FlavaCodebookImpl : public nn::Interceptable<FlavaCodebookImpl, at::Tensor(at::Tensor, at::Tensor)> {
 public:
  FlavaCodebookImpl(const CodebookConfig& config, const torch::TensorOptions& options);
  // pixels (B, channels, H, W), H and W multiples of 8 -> logits (B, vocab, H/8, W/8).
  at::Tensor logits(const at::Tensor& pixels);
  // The visual token of each position, row-major: (B, H/8 * W/8) int64. No gradient. With `positions` (B, H/8 *
  // W/8) bool, only those positions' tokens, the others kIgnoreIndex: the last convolution (vocab logits per
  // position, an eighth of the work at DALL-E's size) runs there only.
  at::Tensor tokens(const at::Tensor& pixels, const at::Tensor& positions = {});
  at::Tensor forward_impl(const at::Tensor& pixels, const at::Tensor& positions);  // tokens(), intercepted

  CodebookConfig config;
  Conv2d input{nullptr}, output{nullptr};
  std::vector<std::vector<CodebookBlock>> groups;

 private:
  // What the last convolution reads: (B, 8 hidden, H/8, W/8), after its ReLU.
  at::Tensor features(const at::Tensor& pixels);
};
TORCH_MODULE(FlavaCodebook);

}  // namespace shardtrain::models
