// The training objectives of the zoo.
#pragma once

#include <ATen/core/Tensor.h>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::models {

// Label value that takes no loss (Hugging Face's and PyTorch's ignore_index).
constexpr int64_t kIgnoreIndex = -100;

// Mean cross-entropy of logits (..., V) against labels (...), computed in float32, kIgnoreIndex positions left out.
at::Tensor masked_cross_entropy(const at::Tensor& logits, const at::Tensor& labels);

// A sequence or image classifier's loss as transformers' *ForSequenceClassification computes it: logits (B, N)
// against labels (B): class ids, the mean cross-entropy (in float32); one output (N = 1) is a regression, float
// scores, the mean squared error; labels (B, N) of 0/1 are a multi-label one's sets of classes, the mean binary
// cross-entropy over every output (BCEWithLogitsLoss).
at::Tensor classifier_loss(const at::Tensor& logits, const at::Tensor& labels);

// Mean next-token cross-entropy: logits (B, T, V) at position t predict labels (B, T) at t + 1.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);

// What position t of a causal LM is trained to predict: labels (B, T) moved one to the left, kIgnoreIndex at the
// last position.
at::Tensor next_token_labels(const at::Tensor& labels);

// The positions that take a loss, for a head to run at those only: the rows of hidden (..., C) whose label (...) is
// not kIgnoreIndex, (K, C), and their labels, (K), in row-major order. A head's loss over them equals
// masked_cross_entropy's over every position, without the others' logits and work.
struct LabelledRows {
  at::Tensor hidden;  // (K, C)
  at::Tensor labels;  // (K)
};
LabelledRows labelled_rows(const at::Tensor& hidden, const at::Tensor& labels);

// masked_cross_entropy(at::linear(hidden, weight, bias), labels) without its (K, V) logits: hidden (K, C), weight
// (V, C), bias (V) or undefined, labels (K). The rows go through in chunks of about 8M logits; each chunk's
// logits, log-softmax and gradient live only while it is processed, since the gradients with respect to hidden,
// weight and bias are computed in forward (the loss ends the graph) and only scaled in backward. What an LM head
// over a 32k vocabulary keeps is then two (V, C) and (K, C) gradients instead of three (K, V) float32 tensors.
// The same loss and gradients to float32 rounding (the weight's accumulated in float32 over the chunks). Under
// no_grad (evaluation) the loss alone, no gradient computed.
//
// With `shard`, the vocabulary is split over a tensor-parallel group (loss parallelism: the logits are never
// gathered whole): weight and bias are rows [start, start + V) of the whole table, every rank of the group calls
// with the same hidden and labels (class ids of the whole vocabulary), the loss is the whole vocabulary's on every
// rank, and hidden's gradient is this rank's part of a sum over the group (the column-parallel input's: the region's
// entry, tp::copy_to_group or tp::gather_along, sums it).
struct VocabShard {
  int64_t start;  // this rank's first row; its rows are the weight's
  int64_t vocab;  // the whole vocabulary's rows (the ranks' parts may differ by one: tp/split.h)
  dist::Communicator group;
};
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& labels, const VocabShard* shard = nullptr);
// Its rows per chunk at a vocabulary of `vocab` (at least one).
int64_t linear_cross_entropy_chunk_rows(int64_t vocab);

}  // namespace shardtrain::models
