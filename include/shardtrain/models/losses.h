// The training objectives of the zoo.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace shardtrain::models {

// Label value that takes no loss (Hugging Face's and PyTorch's ignore_index).
constexpr int64_t kIgnoreIndex = -100;

// Mean cross-entropy of logits (..., V) against labels (...), computed in float32, kIgnoreIndex positions left out.
at::Tensor masked_cross_entropy(const at::Tensor& logits, const at::Tensor& labels);

// Mean next-token cross-entropy: logits (B, T, V) at position t predict labels (B, T) at t + 1.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

// What position t of a causal LM is trained to predict: labels (B, T) moved one to the left, kIgnoreIndex at the
// last position.
at::Tensor next_token_labels(const at::Tensor& labels);

// A head applied at the labelled positions only: `head` maps rows (K, C) of hidden (..., C) whose label (...) is not
// kIgnoreIndex to logits (K, V), and the loss is masked_cross_entropy's over them — the same loss without the
// logits (and the head's work) of the positions that take none. K = 0 gives NaN, as masked_cross_entropy does.
struct LabelledLoss {
  at::Tensor logits;  // (K, V), the labelled positions in row-major order
  at::Tensor loss;    // ()
};
LabelledLoss labelled_cross_entropy(const std::function<at::Tensor(const at::Tensor&)>& head,
                                    const at::Tensor& hidden, const at::Tensor& labels);

// masked_cross_entropy(at::linear(hidden, weight, bias), labels) without its (K, V) logits: hidden (K, C), weight
// (V, C), bias (V) or undefined, labels (K). The rows go through in chunks of about 8M logits; each chunk's
// logits, log-softmax and gradient live only while it is processed, since the gradients with respect to hidden,
// weight and bias are computed in forward (the loss ends the graph) and only scaled in backward. What an LM head
// over a 32k vocabulary keeps is then two (V, C) and (K, C) gradients instead of three (K, V) float32 tensors.
// The same loss and gradients to float32 rounding (the weight's accumulated in float32 over the chunks).
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& labels);
// Its rows per chunk at a vocabulary of `vocab` (at least one).
int64_t linear_cross_entropy_chunk_rows(int64_t vocab);

}  // namespace shardtrain::models
