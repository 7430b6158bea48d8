#include "shardtrain/models/contrastive.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

namespace shardtrain::models {

namespace {

// The backward of all_gather_with_grad: reduce-scatter (sum) of the gathered rows' gradient.
class AllGatherBackward : public torch::autograd::Node {
 public:
  AllGatherBackward(dist::Communicator group, std::vector<int64_t> local_shape)
      : group_(std::move(group)), local_shape_(std::move(local_shape)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor grad = grads[0].contiguous();
    at::Tensor mine = at::empty(local_shape_, grad.options());
    group_.reduce_scatter(mine, grad, dist::ReduceOp::SUM).wait();
    return {mine};
  }
  std::string name() const override { return "shardtrain::models::AllGatherBackward"; }

 private:
  dist::Communicator group_;
  std::vector<int64_t> local_shape_;
};

}  // namespace

at::Tensor all_gather_with_grad(const at::Tensor& x, const dist::Communicator& group) {
  std::vector<int64_t> gathered_shape = x.sizes().vec();
  gathered_shape[0] *= group.size();
  at::Tensor gathered = at::empty(gathered_shape, x.options());
  {
    at::NoGradGuard no_grad;
    group.all_gather(gathered, x.detach().contiguous()).wait();
  }
  if (x.requires_grad()) {
    auto node = std::shared_ptr<AllGatherBackward>(new AllGatherBackward(group, x.sizes().vec()),
                                                   torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(gathered, node);
  }
  return gathered;
}

ContrastiveLogits global_contrastive_logits(const at::Tensor& image, const at::Tensor& text,
                                            const at::Tensor& logit_scale,
                                            const std::optional<dist::Communicator>& group) {
  const int64_t b = image.size(0);
  const bool distributed = group && group->size() > 1;
  at::Tensor all_images = distributed ? all_gather_with_grad(image, *group) : image;
  at::Tensor all_texts = distributed ? all_gather_with_grad(text, *group) : text;
  at::Tensor temperature = logit_scale.exp();
  const int64_t offset = distributed ? static_cast<int64_t>(group->rank()) * b : 0;
  return {at::matmul(image, all_texts.t()) * temperature, at::matmul(text, all_images.t()) * temperature,
          at::arange(offset, offset + b, image.options().dtype(at::kLong))};
}

}  // namespace shardtrain::models
