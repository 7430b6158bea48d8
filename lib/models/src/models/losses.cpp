#include "shardtrain/models/losses.h"

#include <ATen/ATen.h>

namespace shardtrain::models {

at::Tensor masked_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), labels.reshape({-1}),
                                /*weight=*/{}, at::Reduction::Mean, kIgnoreIndex);
}

at::Tensor classifier_loss(const at::Tensor& logits, const at::Tensor& labels) {
  if (labels.dim() == 2) return at::binary_cross_entropy_with_logits(logits.to(at::kFloat), labels.to(at::kFloat));
  if (logits.size(-1) == 1) return at::mse_loss(logits.squeeze(-1).to(at::kFloat), labels.to(at::kFloat));
  return masked_cross_entropy(logits, labels);
}

at::Tensor next_token_labels(const at::Tensor& labels) {
  const int64_t t = labels.size(1);
  return at::cat({labels.narrow(1, 1, t - 1), at::full({labels.size(0), 1}, kIgnoreIndex, labels.options())}, 1);
}

// Position t predicts token t + 1: the labels move one to the left (the last position predicts nothing, -100),
// not the logits, whose (B, T - 1, V) slice would be copied to be flattened — at a 32k vocabulary and 2k tokens,
// 256 MB a sample in forward and again in backward.
at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  return masked_cross_entropy(logits, next_token_labels(labels));
}

LabelledRows labelled_rows(const at::Tensor& hidden, const at::Tensor& labels) {
  const at::Tensor flat = labels.reshape({-1});
  const at::Tensor rows = (flat != kIgnoreIndex).nonzero().squeeze(1);  // (K)
  return {hidden.reshape({-1, hidden.size(-1)}).index_select(0, rows), flat.index_select(0, rows)};
}

}  // namespace shardtrain::models
