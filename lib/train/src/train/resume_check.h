// Resuming under a config that differs from the checkpoint's (private to the train layer): which changes are
// refused, which checkpoint.allow_changes lets through, which are only said. A run that resumes is the run it
// continues only if what it trains is the same: the model and its shape, the optimizer and its schedule, the seed,
// the batch and the data. How it runs — logging, checkpointing, the launcher, the collectives' tuning, the device —
// may change freely.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/config/config.h"

namespace shardtrain::train {

struct ResumeChanges {
  std::vector<config::KeyChange> allowed;  // change the run; named in checkpoint.allow_changes
  std::vector<config::KeyChange> free;     // do not change what is trained
};

// Compares the checkpoint's config (`saved_yaml`, from `checkpoint`) with the run's, `now`. Throws
// std::invalid_argument listing every refused change, each with why: the model and its shape (model.flavor,
// overrides, task, LoRA's rank and targets, the classes; DDP's whole-model files against FSDP's shards) always;
// settings that change the run (optim.*, train.seed, batch_size, grad_accum, steps, max_grad_norm, model.dtype,
// mixed precision, the data) unless checkpoint.allow_changes names them (key, section or "all").
// `auto_batch`: train.batch_size was auto, so the batch it resolved to may differ freely.
ResumeChanges check_resume(const std::string& saved_yaml, const config::Config& now, const std::string& checkpoint,
                           bool auto_batch);

// "optim.lr 0.001 -> 0.0005, log.interval 10 -> 5".
std::string describe_changes(const std::vector<config::KeyChange>& changes);

}  // namespace shardtrain::train
