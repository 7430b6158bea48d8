#include "shardtrain/optim/fused_adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <tuple>
#include <vector>

#include "optim/closure.h"

namespace shardtrain::optim {
namespace {

// What the CUDA kernel demands of each parameter (ATen's check_fast_path_restrictions): the gradient of the
// parameter's dtype, device and sizes, both dense. The CPU kernel checks less (it took a 0-dim gradient for a
// shape-(1) parameter), so the test is ours, the same on both.
bool fusable(const at::Tensor& p) {
  const at::Tensor& g = p.grad();
  return p.layout() == at::kStrided && !g.is_sparse() && p.is_contiguous() && g.is_contiguous() &&
         g.sizes() == p.sizes() && g.scalar_type() == p.scalar_type() && g.device() == p.device() &&
         at::isFloatingType(p.scalar_type());
}

// The tensors of one fused call: parameters of one device and dtype.
struct Batch {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

// LibTorch's step when any parameter is one the kernel cannot take (AMSGrad, sparse, non-contiguous, mixed
// dtypes): the same state either way, so switching between the two is seamless.
bool needs_libtorch_step(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                         const ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>& state) {
  for (const auto& group : groups) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return true;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!fusable(p)) return true;
      auto it = state.find(p.unsafeGetTensorImpl());
      if (it == state.end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      if (!s.exp_avg().is_contiguous() || !s.exp_avg_sq().is_contiguous() || s.exp_avg().sizes() != p.sizes() ||
          s.exp_avg_sq().sizes() != p.sizes()) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  if (needs_libtorch_step(param_groups(), state_)) return torch::optim::AdamW::step(std::move(closure));
  const at::Tensor loss = evaluate_closure(closure);
  c10::AutoGradMode no_grad(false);
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::map<std::tuple<int, int, at::ScalarType>, Batch> batches;  // (device type, index, dtype)
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) {  // as LibTorch's AdamW initialises it
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(0);
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Contiguous));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Contiguous));
        it = state_.emplace(p.unsafeGetTensorImpl(), std::move(s)).first;
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      s.step(s.step() + 1);
      Batch& b = batches[{static_cast<int>(p.device().type()), p.device().index(), p.scalar_type()}];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avgs.push_back(s.exp_avg());
      b.exp_avg_sqs.push_back(s.exp_avg_sq());
      // The kernel reads the (already incremented) step from a float32 tensor on the parameters' device.
      b.steps.push_back(at::full({}, static_cast<double>(s.step()), p.options().dtype(at::kFloat)));
    }
    for (auto& [key, b] : batches) {
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, b.steps, o.lr(),
                        std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                        /*amsgrad=*/false, /*maximize=*/false);
    }
  }
  return loss;
}

}  // namespace shardtrain::optim
