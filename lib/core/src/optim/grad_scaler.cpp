#include "shardtrain/optim/grad_scaler.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::optim {

GradScaler::GradScaler(GradScalerOptions options, std::optional<dist::Communicator> group)
    : options_(options), group_(std::move(group)), scale_(options.init_scale) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("GradScaler: " + what);
  };
  require(std::isfinite(options.init_scale) && options.init_scale > 0,
          "init_scale = " + std::to_string(options.init_scale) + ", expected a finite value > 0");
  require(options.growth_factor > 1, "growth_factor = " + std::to_string(options.growth_factor) + ", expected > 1");
  require(options.backoff_factor > 0 && options.backoff_factor < 1,
          "backoff_factor = " + std::to_string(options.backoff_factor) + ", expected in (0, 1)");
  require(options.growth_interval >= 1,
          "growth_interval = " + std::to_string(options.growth_interval) + ", expected >= 1");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (stage_ != Stage::READY) {
    throw std::logic_error("GradScaler::unscale: called twice in one step (unscale, step, then update)");
  }
  c10::AutoGradMode no_grad(false);
  // The fused check-and-unscale takes tensors of one device and dtype at a time.
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> grads;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      grads[{p.grad().device().str(), p.grad().scalar_type()}].push_back(p.grad());
    }
  }
  at::Tensor found;  // (1) float32: > 0 when some gradient is not finite
  for (auto& [key, list] : grads) {
    const auto options = at::TensorOptions().dtype(at::kFloat).device(list.front().device());
    at::Tensor found_here = at::zeros({1}, options);
    at::_amp_foreach_non_finite_check_and_unscale_(list, found_here, at::full({1}, 1.0 / scale_, options));
    found = found.defined() ? found + found_here.to(found.device()) : found_here;
  }
  if (!found.defined()) found = at::zeros({1}, at::kFloat);
  if (group_ && group_->size() > 1) {
    found = found.to(group_->device());  // NCCL reduces CUDA tensors; offloaded gradients are on the CPU
    group_->all_reduce(found, dist::ReduceOp::MAX).wait();
  }
  found_inf_ = found.item<float>() > 0;
  stage_ = Stage::UNSCALED;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (stage_ == Stage::STEPPED) throw std::logic_error("GradScaler::step: called twice in one step; call update()");
  if (stage_ == Stage::READY) unscale(optimizer);
  stage_ = Stage::STEPPED;
  if (found_inf_) {
    ++skipped_steps_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::skip_step() {
  if (stage_ == Stage::STEPPED) throw std::logic_error("GradScaler::skip_step: called after step(); call update()");
  stage_ = Stage::STEPPED;
  found_inf_ = true;
  ++skipped_steps_;
}

void GradScaler::update() {
  if (stage_ != Stage::STEPPED) throw std::logic_error("GradScaler::update: no step() since the last update");
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  stage_ = Stage::READY;
  found_inf_ = false;
}

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  if (!(std::isfinite(scale) && scale > 0) || growth_tracker < 0 || growth_tracker >= options_.growth_interval) {
    throw std::invalid_argument("GradScaler::load_state: scale " + std::to_string(scale) + ", growth tracker " +
                                std::to_string(growth_tracker) + " (expected scale > 0, 0 <= tracker < " +
                                std::to_string(options_.growth_interval) + ")");
  }
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace shardtrain::optim
