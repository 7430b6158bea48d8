#include "shardtrain/models/contrastive.h"

#include <ATen/ATen.h>

#include "shardtrain/tp/regions.h"

namespace shardtrain::models {

ContrastiveLogits global_contrastive_logits(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& logit_scale,
                                            const std::optional<dist::Communicator>& group) {
  const int64_t b = image.size(0);
  const bool distributed = group && group->size() > 1;
  // Every rank's rows in rank order; each rank's gradient for its own rows is the sum over ranks
  // (torch.distributed.nn.functional.all_gather's).
  at::Tensor all_images = distributed ? tp::gather_along(image, 0, *group) : image;
  at::Tensor all_texts = distributed ? tp::gather_along(text, 0, *group) : text;
  at::Tensor temperature = logit_scale.exp();
  const int64_t offset = distributed ? static_cast<int64_t>(group->rank()) * b : 0;
  return {at::matmul(image, all_texts.t()) * temperature, at::matmul(text, all_images.t()) * temperature,
          at::arange(offset, offset + b, image.options().dtype(at::kLong))};
}

}  // namespace shardtrain::models
