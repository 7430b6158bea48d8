// FLAVA's global contrastive loss (CLIP's, over the whole global batch): image and text embeddings are gathered
// from every rank, and gradients flow back to the rank that produced each row — what makes FLAVA gain from large
// global batches.
#pragma once

#include <ATen/core/Tensor.h>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::models {

struct ContrastiveLogits {
  at::Tensor per_image;  // (B, W*B): this rank's images against every rank's texts, times exp(logit_scale)
  at::Tensor per_text;   // (B, W*B)
  at::Tensor labels;     // (B): the global index of each row's own pair, rank * B + i
};

// image, text (B, D), L2-normalised; logit_scale () the log temperature. No group: this process alone.
ContrastiveLogits global_contrastive_logits(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& logit_scale,
                                            const std::optional<dist::Communicator>& group);

}  // namespace shardtrain::models
