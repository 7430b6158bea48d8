#include "shardtrain/models/losses.h"

#include <ATen/ATen.h>

namespace shardtrain::models {

at::Tensor masked_cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), labels.reshape({-1}),
                                /*weight=*/{}, at::Reduction::Mean, kIgnoreIndex);
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t t = logits.size(1);
  return masked_cross_entropy(logits.narrow(1, 0, t - 1), labels.narrow(1, 1, t - 1));
}

}  // namespace shardtrain::models
