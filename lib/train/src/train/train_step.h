// One optimizer step of the loop (private to the train layer): each micro-batch's forward and backward (gradients
// reduced on the last one only, unless train.sync_each_batch), float16 unscaling, clipping by the global norm, the
// optimizer step — skipped on every rank when the loss on any rank or the gradient norm is not finite, or when
// float16 gradients overflowed on any —, zeroed gradients.
#pragma once

#include <torch/optim/optimizer.h>

#include <optional>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/optim/grad_scaler.h"
#include "train/interval_metrics.h"
#include "train/parallel_model.h"
#include "train/pipeline_step.h"

namespace shardtrain::train {

// The optimizer of a run, optim.name: AdamW (optim::FusedAdamW unless optim.fused is false), AnyPrecision AdamW,
// Adafactor (its whole-parameter statistics summed over the shard group) or SGD, with no weight decay for biases,
// norms and scalars (optim.no_decay_1d) and for the parameters optim.no_decay's regular expressions match.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const config::Config& config, const ParallelModel& model);
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// What a step works on.
struct StepParts {
  ParallelModel& model;
  const models::ModelRecipe& recipe;
  const models::Task& task;
  torch::optim::Optimizer& optimizer;
  optim::GradScaler* scaler;  // float16 only
  c10::Device device;
  uint64_t seed;              // the objective's own draws (T5's spans): train.seed and the rank
  const dist::Communicator& world;  // agrees on non-finite losses
  PipelineStep* pipeline = nullptr;  // parallel.pp_size above 1: each batch goes through it
};

// The ranks whose `mine` is true ("rank 1", "ranks 1, 3", "every rank"), the same text on every rank; "" when
// none. Collective over `world`: each rank marks its own slot of a W-element vector and the sum tells every rank.
std::string nonfinite_ranks(bool mine, const dist::Communicator& world);

// Trains on the micro-batches of one step; the caller times it (StepTotals::seconds) and decides what a step that
// was not finite (StepTotals::nonfinite, the same on every rank; nothing was updated) means for the run.
// Collective over parts.world.
StepTotals train_step(StepParts& parts, const config::Config& config, std::vector<data::Batch> batches);

}  // namespace shardtrain::train
