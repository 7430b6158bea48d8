// Loss scaling for float16 training (PyTorch's GradScaler; FSDP's ShardedGradScaler when given a group). The loss
// is multiplied by a scale before backward so that small float16 gradients do not flush to zero; before the
// optimizer step the gradients are divided by it and checked, and if any is inf or NaN on any rank of the group
// the step is skipped and the scale backs off. After growth_interval clean steps in a row the scale grows.
//
//   optim::GradScaler scaler({}, &world);
//   scaler.scale(loss).backward();
//   scaler.unscale(optimizer);        // before clipping, so that the norm is of the true gradients
//   fsdp::clip_grad_norm(model, 1.0);
//   scaler.step(optimizer);           // skipped when a gradient is not finite
//   scaler.update();
//
// Scales are powers of two by default, so scaling and unscaling change no bits of a finite gradient.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "shardtrain/distributed/communicator.h"

namespace torch::optim {
class Optimizer;
}

namespace shardtrain::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows
};

class GradScaler {
 public:
  // `group`: the ranks whose gradients make up one step together (the shard group of a sharded model, or the
  // world): a gradient that is not finite on one of them skips the step on all. nullptr: this process alone.
  // Throws std::invalid_argument naming a bad option.
  explicit GradScaler(GradScalerOptions options = {}, std::optional<dist::Communicator> group = std::nullopt);

  at::Tensor scale(const at::Tensor& loss) const;  // loss * scale

  // Divides the gradients of the optimizer's parameters by the scale and finds whether any is not finite here or
  // on another rank of the group (one all-reduce). Once per step; step() calls it when the caller did not.
  void unscale(torch::optim::Optimizer& optimizer);
  // optimizer.step() unless a gradient was not finite. Returns whether it stepped. Once per step.
  bool step(torch::optim::Optimizer& optimizer);
  // Instead of step(): the caller found the step unusable (a loss that is not finite on some rank); counted as a
  // skipped step, and update() backs the scale off as after an overflow.
  void skip_step();
  // Ends the step: the scale times backoff_factor after a skipped step, times growth_factor after growth_interval
  // clean steps in a row.
  void update();

  double scale_value() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // clean steps in a row since the scale last changed
  int64_t skipped_steps() const { return skipped_steps_; }
  // Resuming: the values scale_value() and growth_tracker() had.
  void load_state(double scale, int64_t growth_tracker);

 private:
  enum class Stage { READY, UNSCALED, STEPPED };

  GradScalerOptions options_;
  std::optional<dist::Communicator> group_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
  Stage stage_ = Stage::READY;
  bool found_inf_ = false;
};

}  // namespace shardtrain::optim
