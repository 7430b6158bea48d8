// Saving and resuming a run (private to the train layer): the trainer's side of ckpt/checkpoint.h — which step, the
// data position, the float16 loss scale, the run id, and the config they came from.
#pragma once

#include <optional>
#include <string>

#include "shardtrain/ckpt/async_save.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/config/config.h"
#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/log/log.h"
#include "shardtrain/optim/grad_scaler.h"

namespace shardtrain::train {

// Where a run stands between steps.
struct RunPosition {
  int64_t step = 0;         // optimizer steps done
  data::LoaderState loader; // the data stream's position
  std::string run_id;       // whose checkpoints these are (ckpt/manifest.h); kept by resumes and restarts
};

// How a run starts, by checkpoint.resume and by whether its launcher restarted it (env.restart_count > 0):
//   true: from the newest checkpoint in checkpoint.dir that verifies; std::invalid_argument when there is none.
//   auto: the same when the directory holds checkpoints, else afresh.
//   false: afresh, taking checkpoint.dir for itself: when it already holds checkpoints, throws
//          std::invalid_argument saying what is there and the ways out, or with checkpoint.overwrite removes them.
//          A restarted worker group resumes instead, from its own job's checkpoints (run id = env.job_id).
// Checkpoints that do not verify are skipped, newest first, each named with the reason; when every one fails,
// the run stops rather than start over beside them. A checkpoint trained with another model, or other settings
// that checkpoint.allow_changes does not allow, is refused before it loads, every change named (resume_check.h;
// `auto_batch`: train.batch_size was auto). A fresh run's id is the launcher's job id, or a random one; rank 0's
// is everybody's. Restores the model, the optimizer and the scaler (when given). The caller holds checkpoint.dir's
// lock (checkpoint_lock.h). Collective.
RunPosition start_run(const config::Config& config, const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                      const dist::Communicator& world, const dist::DistEnv& env, const log::Logger& logger,
                      bool auto_batch);

// An elastic job (env.elastic: `launch --nnodes MIN:MAX`) that will resume from a checkpoint saved at another world
// size keeps the checkpoint's global batch (train.batch_size x grad_accum x data-parallel ranks) by changing
// train.grad_accum when the new data-parallel size divides it — and allows that change on resume —, or else keeps
// the config and its global batch changes. Returns what it did, for the start-up ("" when nothing changed: not
// elastic, no checkpoint, the same world size). The checkpoint is the one start_run tries first.
std::string keep_global_batch(config::Config& config, const dist::DistEnv& env);

// train.on_nonfinite's rollback: loads the newest checkpoint of run `run_id` in checkpoint.dir that verifies (the
// model, the optimizer, the loss scale), skipping damaged ones with a warning; nullopt when there is none. The data
// stream stays where it is: the batches since the checkpoint are not trained on again. Collective.
struct RolledBack {
  std::string path;
  int64_t step = 0;
};
std::optional<RolledBack> roll_back(const config::Config& config, const std::string& run_id,
                                    const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                                    const dist::Communicator& world, const log::Logger& logger);

// Saves step `at.step` atomically into checkpoint.dir and prunes this run's to checkpoint.keep. Collective; returns
// the path.
std::string save_run(const config::Config& config, const RunPosition& at, const optim::GradScaler* scaler,
                     const ckpt::CheckpointModel& model, const dist::Communicator& world);
// The same handed to `writer` (checkpoint.async): returns once this rank's share is staged; the writer thread
// writes it and then prunes. No save may be in flight (AsyncCheckpointer::wait). Collective.
ckpt::AsyncSaveStarted start_saving_run(const config::Config& config, const RunPosition& at,
                                        const optim::GradScaler* scaler, const ckpt::CheckpointModel& model,
                                        const dist::Communicator& world, ckpt::AsyncCheckpointer& writer);

}  // namespace shardtrain::train
