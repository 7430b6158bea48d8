// The training loop of `shardtrain train`: one call per rank runs the whole job a Config describes.
//
//   data -> loader threads -> micro-batches -> forward/backward (gradient accumulation, no sync until the last)
//        -> clip -> AdamW with the schedule's lr -> metrics every log.interval -> eval every train.eval_interval
//        -> checkpoint every checkpoint.interval and at the end
//        -> SIGTERM/SIGINT on any rank: every rank stops after the step with a checkpoint (summary.preempted_by)
//
// What the model is and what it trains on come from its family's recipe (models/recipe.h): the trainer knows no
// family. docs/notes/architecture.md walks one step through the layers.
//
// The process group comes from the environment `shardtrain launch` (or torchrun, MPI, Slurm) sets; one process
// alone is a world of one. Library code: errors throw (std::invalid_argument for bad configuration or data,
// std::runtime_error for what failed while running), the caller decides how to exit.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "shardtrain/config/config.h"
#include "shardtrain/log/log.h"

namespace shardtrain::train {

struct TrainSummary {
  int64_t start_step = 0;  // > 0 after a resume
  int64_t steps = 0;       // optimizer steps done at the end
  double first_loss = 0, last_loss = 0;        // means over the first and the last logging interval
  int64_t first_loss_steps = 0;                // the steps the first interval's mean covers (the last's: the end)
  int64_t intervals = 0;                       // logging intervals done
  std::map<std::string, double> first_eval, last_eval;  // the task's evaluation on data.eval (FLAVA: R@1, ITM)
  int64_t skipped_samples = 0;                 // unusable samples replaced by the loader (this rank)
  std::string last_checkpoint;
  // SIGTERM or SIGINT stopped the run early, after a checkpoint (when checkpoint.dir is set); 0: it was not. The
  // CLI then exits with launch::kPreemptedExitCode.
  int preempted_by = 0;
};

// The memory model's view of a run (`shardtrain train --dry-run`, and train.batch_size: auto): the job as the
// memory model sees it, the predicted bytes per rank by term, and the batch. With batch_size auto, `config` comes
// back with the largest batch predicted to fit train.memory_budget less a 10% margin — at most `auto_batch_limit`
// when that is > 0 (what an out-of-memory at a larger batch left) —, and `text` says why. Builds the model's shapes
// only (meta device). Throws std::invalid_argument when even one sample does not fit.
struct RunPlan {
  config::Config config;  // train.batch_size and parallel.layout: auto resolved
  std::string text;       // the plan, for the console: layout_text, train.batch_size: auto's line, estimate_text
  // parallel.layout: auto: what it chose, the runner-up and why, one line each (train/auto_layout.h); "" else.
  std::string layout_text;
  std::string estimate_text;  // the memory model's estimate by term (plan::format_estimate)
  int64_t peak_bytes = 0;  // predicted per rank
  std::string peak_phase;  // forward, backward or step
  std::string json;        // the estimate as `shardtrain estimate-memory --json` writes it
  // An explicit train.batch_size whose predicted peak is above what a rank has (train.memory_limit, else
  // memory_budget, the GPU's memory, or the machine's RAM shared by its ranks): why, with the largest batch that
  // fits and the other changes that would fit it (checkpointing, full sharding); "" when it fits. `shardtrain
  // train` refuses it before any worker starts unless train.force.
  std::string over_budget;
  int64_t budget_bytes = 0;  // what a rank has, as above (0: no bound known)
  std::string budget_source;  // where budget_bytes comes from: "train.memory_budget", "the GPU's memory", ...
};
RunPlan plan_run(const config::Config& config, int64_t auto_batch_limit = 0);

// train.batch_size: auto chose a batch that ran out of memory (c10::OutOfMemoryError) before the run's second step
// completed (the first step's update creates the optimizer state, so the second is the first at the full peak).
// train() retries by itself at half the batch when it is the only rank; with more ranks, where the others wait in
// collectives this rank left, it throws this: the CLI records `retry_batch` in the launcher's error file and exits
// with launch::kOutOfMemoryExitCode, and `shardtrain launch` restarts every rank with the batch limited to it
// ([Note: a smaller batch after an out-of-memory] in launch/launch.h).
class AutoBatchOutOfMemory : public std::runtime_error {
 public:
  AutoBatchOutOfMemory(const std::string& what, int64_t retry_batch)
      : std::runtime_error(what), retry_batch(retry_batch) {}
  int64_t retry_batch;  // per rank, at least 1
};

// Console output goes to `sink` (log::console_sink() for a terminal; null: none), filtered by log.level. With
// train.batch_size: auto the batch is limited by launch::kAutoBatchLimitEnv when the launcher set it.
TrainSummary train(const config::Config& config, std::shared_ptr<log::Sink> sink = nullptr);

}  // namespace shardtrain::train
