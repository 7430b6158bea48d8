// parallel.layout: auto — the planner's recommended layout for the job a config describes, as that config's keys.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/config/config.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/plan/planner.h"

namespace shardtrain::train {

struct ChosenLayout {
  config::Config config;  // the layout's keys set (parallel.layout given from here on)
  // What it chose and why, one line each: the keys and prediction, the runner-up, the planner's reason, and the
  // `shardtrain plan` command that ranks the same configurations.
  std::string text;
};

// `config`'s layout chosen by plan::plan_configurations for `job`'s ranks and nodes (job_of: the launcher's world)
// with `budget` bytes a rank (from `budget_source`) less `margin`, at the config's precision (bf16 rows for fp16)
// and tokens: the global batch (train.batch_size x grad_accum x the ranks) split as each layout needs, or with
// train.batch_size auto each at its largest batch (left auto, for plan_run's search). plan::recommended's pick. On a
// GPU, the preset whose name the device's carries (gpu_specs); on the CPU, the default preset's constants rank them.
// Throws std::invalid_argument naming the budget when nothing fits.
ChosenLayout choose_layout(const config::Config& config, const models::ModelRecipe& recipe,
                           const plan::TrainingJob& job, int64_t budget, const std::string& budget_source,
                           double margin);

}  // namespace shardtrain::train
