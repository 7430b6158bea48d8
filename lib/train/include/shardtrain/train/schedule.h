// The learning-rate schedule: linear warm-up from 0, then cosine or linear decay to lr * min_lr_ratio at the last
// step, or constant.
#pragma once

#include <cstdint>

#include "shardtrain/config/config.h"

namespace shardtrain::train {

// The learning rate of optimizer step `step` (0-based) of `total_steps`.
double learning_rate(const config::OptimConfig& optim, int64_t step, int64_t total_steps);

}  // namespace shardtrain::train
