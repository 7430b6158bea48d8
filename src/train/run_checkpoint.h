// Saving and resuming a run (private to the train layer): the trainer's side of ckpt/checkpoint.h — which step, the
// data position, the float16 loss scale, and the config they came from.
#pragma once

#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/config/config.h"
#include "shardtrain/data/loader.h"
#include "shardtrain/log/log.h"
#include "shardtrain/optim/grad_scaler.h"

namespace shardtrain::train {

// Where a run stands between steps.
struct RunPosition {
  int64_t step = 0;         // optimizer steps done
  data::LoaderState loader; // the data stream's position
};

// A run that does not resume takes checkpoint.dir for itself: when it already holds checkpoints, throws
// std::invalid_argument saying what is there and the ways out, or with checkpoint.overwrite removes them (rank 0,
// after every rank has looked). Collective when there are any.
void claim_checkpoint_dir(const config::Config& config, const dist::Communicator& world, const log::Logger& logger);

// Restores the newest complete checkpoint of checkpoint.dir into `model` (and the scaler when given). Collective.
// Throws std::invalid_argument when there is none or it is of another flavor.
RunPosition resume_run(const config::Config& config, const ckpt::CheckpointModel& model, optim::GradScaler* scaler,
                       const dist::Communicator& world, const log::Logger& logger);

// Saves step `at.step` atomically into checkpoint.dir and prunes to checkpoint.keep. Collective; returns the path.
std::string save_run(const config::Config& config, const RunPosition& at, const optim::GradScaler* scaler,
                     const ckpt::CheckpointModel& model, const dist::Communicator& world);

}  // namespace shardtrain::train
