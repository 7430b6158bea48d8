// The training objectives of the zoo.
#pragma once

#include <ATen/core/Tensor.h>

namespace shardtrain::models {

// Label value that takes no loss (Hugging Face's and PyTorch's ignore_index).
constexpr int64_t kIgnoreIndex = -100;

// Mean cross-entropy of logits (..., V) against labels (...), computed in float32, kIgnoreIndex positions left out.
at::Tensor masked_cross_entropy(const at::Tensor& logits, const at::Tensor& labels);

// Mean next-token cross-entropy: logits (B, T, V) at position t predict labels (B, T) at t + 1.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace shardtrain::models
