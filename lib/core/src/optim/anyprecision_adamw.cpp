#include "shardtrain/optim/anyprecision_adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "optim/anyprecision_foreach.h"
#include "optim/anyprecision_kernel.h"
#include "optim/closure.h"

namespace shardtrain::optim {
namespace {

void check(bool ok, const std::string& what, double value, const char* expected) {
  if (!ok) {
    throw std::invalid_argument("AnyPrecisionAdamW: " + what + " " + std::to_string(value) + " is not " + expected);
  }
}

void check_options(const AnyPrecisionAdamWOptions& o) {
  check(o.lr() >= 0, "lr", o.lr(), "0 or positive");
  check(o.eps() >= 0, "eps", o.eps(), "0 or positive");
  check(o.weight_decay() >= 0, "weight_decay", o.weight_decay(), "0 or positive");
  check(std::get<0>(o.betas()) >= 0 && std::get<0>(o.betas()) < 1, "beta1", std::get<0>(o.betas()), "in [0, 1)");
  check(std::get<1>(o.betas()) >= 0 && std::get<1>(o.betas()) < 1, "beta2", std::get<1>(o.betas()), "in [0, 1)");
  for (at::ScalarType t : {o.momentum_dtype(), o.variance_dtype(), o.compensation_buffer_dtype()}) {
    if (!at::isFloatingType(t)) {
      throw std::invalid_argument(std::string("AnyPrecisionAdamW: state dtype ") + c10::toString(t) +
                                  " is not a floating-point type");
    }
  }
}

// A double as Python hands it to a tensor op (a wrapped number), so that a bf16 or float16 tensor's op takes it at
// float precision, as torchdistx's Python update does. LibTorch's Tensor::mul_(Scalar) casts the scalar to the
// tensor's dtype first: for bf16 moments beta1 = 0.9 became 0.8984 and beta2 = 0.999 became 1.0.
at::Tensor exact(double v) {
  at::Tensor t = at::scalar_tensor(v, at::kDouble);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

}  // namespace

AnyPrecisionAdamWOptions::AnyPrecisionAdamWOptions(double lr) : lr_(lr) {}

AnyPrecisionAdamW::AnyPrecisionAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                                     AnyPrecisionAdamWOptions defaults)
    : torch::optim::Optimizer(param_groups, std::make_unique<AnyPrecisionAdamWOptions>(defaults)) {
  for (const auto& group : this->param_groups()) {
    check_options(static_cast<const AnyPrecisionAdamWOptions&>(group.options()));
  }
}

AnyPrecisionAdamWParamState& AnyPrecisionAdamW::new_state(const at::Tensor& param, const AnyPrecisionAdamWOptions& o,
                                                           int64_t step) {
  auto zeros = [&](at::ScalarType dtype) {
    return at::zeros_like(param, param.options().dtype(dtype), at::MemoryFormat::Contiguous);
  };
  auto s = std::make_unique<AnyPrecisionAdamWParamState>();
  s->step(step);
  s->exp_avg(zeros(o.momentum_dtype()));
  s->exp_avg_sq(zeros(o.variance_dtype()));
  if (o.use_kahan_summation()) s->compensation(zeros(o.compensation_buffer_dtype()));
  auto& slot = state_[param.unsafeGetTensorImpl()];
  slot = std::move(s);
  return static_cast<AnyPrecisionAdamWParamState&>(*slot);
}

AnyPrecisionAdamWParamState& AnyPrecisionAdamW::empty_state(const at::Tensor& param, int64_t step) {
  for (const auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      if (!p.is_same(param)) continue;
      return new_state(param, static_cast<const AnyPrecisionAdamWOptions&>(group.options()), step);
    }
  }
  return new_state(param, static_cast<const AnyPrecisionAdamWOptions&>(defaults()), step);
}

// torchdistx's update, with LibTorch AdamW's order of operations (so that float32 without Kahan is bitwise
// AdamW): decoupled weight decay, the moments in their own dtypes, the bias-corrected step, and with Kahan
// summation the update added to the compensation first, then the parameter moved by it, then the compensation
// left with what the parameter's dtype rounded away. With fused(): parameters the CPU kernel takes
// (anyprecision_kernel.h) are collected and stepped by it in one pass at the end, those on a GPU whose state shares
// their dtype by the same operations over lists (anyprecision_foreach.h), a group at a time. The others (float16
// or non-contiguous on the CPU, mixed dtypes on a GPU) stay per operation: ATen's list operations would run them
// tensor by tensor anyway, with their scalars rounded to the tensors' dtype by LibTorch (beta1 0.9 to 0.8984 in
// bf16) where exact() keeps float precision.
at::Tensor AnyPrecisionAdamW::step(LossClosure closure) {
  const at::Tensor loss = evaluate_closure(closure);
  c10::AutoGradMode no_grad(false);
  std::vector<AnyPrecisionTensors> fused;  // stepped together at the end
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const AnyPrecisionAdamWOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    std::vector<AnyPrecisionTensors> lists;  // this group's, stepped after its loop
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw std::invalid_argument("AnyPrecisionAdamW does not take sparse gradients");
      auto it = state_.find(p.unsafeGetTensorImpl());
      AnyPrecisionAdamWParamState& s =
          it == state_.end() ? new_state(p, o, 0) : static_cast<AnyPrecisionAdamWParamState&>(*it->second);
      if (o.use_kahan_summation() && !s.compensation().defined()) {
        s.compensation(at::zeros_like(p, p.options().dtype(o.compensation_buffer_dtype())));
      }
      s.step(s.step() + 1);
      const at::Tensor& grad = p.grad();
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step()));
      const double step_size = o.lr() / bias_correction1;
      const bool one_pass =
          o.fused() && fused_anyprecision_takes(p, grad, s.exp_avg(), s.exp_avg_sq(), s.compensation());
      const bool listed =
          o.fused() && foreach_anyprecision_takes(p, grad, s.exp_avg(), s.exp_avg_sq(), s.compensation());
      if (one_pass || listed) {
        AdamWStepScalars scalars;
        scalars.decay = 1 - o.lr() * o.weight_decay();
        scalars.beta1 = beta1;
        scalars.beta2 = beta2;
        scalars.sqrt_bias_correction2 = std::sqrt(bias_correction2);
        scalars.eps = o.eps();
        scalars.step_size = step_size;
        (one_pass ? fused : lists).push_back({p, grad, s.exp_avg(), s.exp_avg_sq(), s.compensation(), scalars});
        continue;
      }
      if (o.weight_decay() != 0) p.mul_(exact(1 - o.lr() * o.weight_decay()));
      s.exp_avg().mul_(exact(beta1)).add_(grad, 1 - beta1);
      s.exp_avg_sq().mul_(exact(beta2)).addcmul_(grad, grad, 1 - beta2);
      const at::Tensor denom = (s.exp_avg_sq().sqrt() / exact(std::sqrt(bias_correction2))).add_(exact(o.eps()));
      if (o.use_kahan_summation()) {
        at::Tensor& c = s.compensation();
        c.addcdiv_(s.exp_avg(), denom, -step_size);
        const at::Tensor before = p.detach().clone();
        p.add_(c);
        c.add_(before.sub_(p));  // what the parameter's dtype could not take stays for the next step
      } else {
        p.addcdiv_(s.exp_avg(), denom, -step_size);
      }
    }
    foreach_anyprecision_step(lists);
  }
  fused_anyprecision_step(fused);
  return loss;
}

}  // namespace shardtrain::optim
