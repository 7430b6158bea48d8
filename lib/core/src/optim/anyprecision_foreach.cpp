#include "optim/anyprecision_foreach.h"

#include <ATen/ATen.h>

#include <map>
#include <stdexcept>
#include <tuple>

namespace shardtrain::optim {
namespace {

// The tensors of one list: one device, and one dtype for each role.
struct Lists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, compensations;
  std::vector<at::Scalar> decays, sqrt_bias_corrections2, epss, neg_step_sizes;
  bool decayed = false;  // any decay other than 1 (a multiplication by 1 changes nothing but costs a pass)
};

using Key = std::tuple<int, int, int, int, int, int, int>;  // device type, index, and the five roles' dtypes

Key key_of(const AnyPrecisionTensors& t) {
  const int compensation = t.compensation.defined() ? static_cast<int>(t.compensation.scalar_type()) : -1;
  return {static_cast<int>(t.param.device().type()), t.param.device().index(),
          static_cast<int>(t.param.scalar_type()), static_cast<int>(t.grad.scalar_type()),
          static_cast<int>(t.exp_avg.scalar_type()), static_cast<int>(t.exp_avg_sq.scalar_type()), compensation};
}

void step_lists(Lists& l, double beta1, double beta2) {
  if (l.decayed) at::_foreach_mul_(l.params, l.decays);
  at::_foreach_mul_(l.exp_avgs, beta1);
  at::_foreach_add_(l.exp_avgs, l.grads, 1 - beta1);
  at::_foreach_mul_(l.exp_avg_sqs, beta2);
  at::_foreach_addcmul_(l.exp_avg_sqs, l.grads, l.grads, 1 - beta2);
  std::vector<at::Tensor> denoms = at::_foreach_sqrt(l.exp_avg_sqs);
  at::_foreach_div_(denoms, l.sqrt_bias_corrections2);
  at::_foreach_add_(denoms, l.epss);
  if (l.compensations.empty()) {
    at::_foreach_addcdiv_(l.params, l.exp_avgs, denoms, l.neg_step_sizes);
    return;
  }
  // Kahan: the update joins the compensation, the parameter moves by it, and what the parameter's dtype rounded
  // away stays in the compensation. `before` copies the parameters (a multiplication by 1 is exact in any dtype).
  at::_foreach_addcdiv_(l.compensations, l.exp_avgs, denoms, l.neg_step_sizes);
  std::vector<at::Tensor> before = at::_foreach_mul(l.params, 1.0);
  at::_foreach_add_(l.params, l.compensations);
  at::_foreach_sub_(before, l.params);
  at::_foreach_add_(l.compensations, before);
}

}  // namespace

bool foreach_anyprecision_takes(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                                const at::Tensor& exp_avg_sq, const at::Tensor& compensation) {
  if (param.is_cpu() || param.device().is_meta()) return false;
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq, &compensation}) {
    if (t == &compensation && !t->defined()) continue;
    if (t->device() != param.device() || t->scalar_type() != param.scalar_type() || !t->is_contiguous() ||
        t->layout() != at::kStrided) {
      return false;
    }
  }
  return true;
}

void foreach_anyprecision_step(const std::vector<AnyPrecisionTensors>& params) {
  if (params.empty()) return;
  const double beta1 = params.front().scalars.beta1, beta2 = params.front().scalars.beta2;
  std::map<Key, Lists> lists;
  for (const AnyPrecisionTensors& t : params) {
    const AdamWStepScalars& s = t.scalars;
    if (s.beta1 != beta1 || s.beta2 != beta2) {
      throw std::invalid_argument("foreach_anyprecision_step: betas (" + std::to_string(s.beta1) + ", " +
                                  std::to_string(s.beta2) + ") differ from the first tensor's (" +
                                  std::to_string(beta1) + ", " + std::to_string(beta2) + "); expected one group");
    }
    Lists& l = lists[key_of(t)];
    l.params.push_back(t.param);
    l.grads.push_back(t.grad);
    l.exp_avgs.push_back(t.exp_avg);
    l.exp_avg_sqs.push_back(t.exp_avg_sq);
    if (t.compensation.defined()) l.compensations.push_back(t.compensation);
    l.decays.emplace_back(s.decay);
    l.decayed = l.decayed || s.decay != 1;
    l.sqrt_bias_corrections2.emplace_back(s.sqrt_bias_correction2);
    l.epss.emplace_back(s.eps);
    l.neg_step_sizes.emplace_back(-s.step_size);
  }
  for (auto& [key, l] : lists) step_lists(l, beta1, beta2);
}

}  // namespace shardtrain::optim
