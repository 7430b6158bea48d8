#include "shardtrain/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace shardtrain::train {

double learning_rate(const config::OptimConfig& o, int64_t step, int64_t total_steps) {
  // Step s of the warm-up uses lr * (s + 1) / warmup, so the first step already learns (as torchtitan does).
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == config::LrSchedule::CONSTANT) return o.lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - o.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay_steps));
  const double floor = o.lr * o.min_lr_ratio;
  const double shape = o.schedule == config::LrSchedule::COSINE ? 0.5 * (1 + std::cos(M_PI * progress)) : 1 - progress;
  return floor + (o.lr - floor) * shape;
}

}  // namespace shardtrain::train
