// What one rank holds during a training step, before the step is walked: the sharded state, each unit's gathered
// size, what reductions and DDP's buckets hold, the activations each layer keeps. Bytes per rank throughout.
// memory_model.cpp walks it through the phases (step_phases.h); the strategy's policies — which units reshard after
// forward, whether a reduction overlaps the next unit's backward, what a reduce-scatter holds besides its input and
// output — come from the runtime's own descriptions (fsdp/fully_shard.h, distributed/communicator.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/models/activation_memory.h"
#include "shardtrain/plan/memory_model.h"

namespace shardtrain::plan {

// The units of a wrap: per transformer layer and the root (and the recipe's extra units), or everything in one
// unit.
struct Units {
  std::vector<int64_t> numel, trainable;  // per unit, the root last; trainable: gradients and AdamW state
  std::vector<int64_t> float8;             // per unit, what float8 converts (ModelShape::layer_float8)
  int64_t extra_numel = 0, extra_trainable = 0;  // the extra units together (not in numel)
  int64_t input_numel = 0, input_trainable = 0, output_numel = 0, output_trainable = 0;  // edge units (not in numel)
};
Units units_of(const ModelShape& shape, parallel::Wrap wrap);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct StepLayout {
  const TrainingJob* job = nullptr;
  const ModelShape* shape = nullptr;
  models::ActivationBytes act;
  Units units;
  bool autocast = false;  // DDP under mixed precision (train/parallel_model.cpp)

  // Element sizes: the parameters' own (and their gradients'), the compute dtype's, the reduction's.
  int64_t pe = 4, ce = 4, rd = 4;
  int64_t shard = 1;  // ranks a parameter is sharded over: the node for hybrid strategies, one when replicated
  int64_t parameters = 0;
  size_t layer_units = 0;
  int64_t largest_layer = 0, largest_layer_trainable = 0;
  // The root's trainable parameters that get a gradient in the step walked (its unused heads get none), and of
  // them those registered before the first layer (their gradients come last).
  int64_t root_unit = 0, root_trainable = 0, root_input_side = 0;

  // Sharded state: parameters, gradients and optimizer state (host memory when offloaded).
  int64_t shard_numel = 0, trainable_shard_numel = 0;
  int64_t params = 0, grads = 0, adam = 0;
  bool offload = false;
  // The optimizer's state on disk (job.optimizer_on_disk): what the host holds of it instead, the two staging buffers
  // a step streams it through (optim::DiskAdamW's, 64 MiB each, or a larger parameter's moments; one, of the
  // state's size, when it fits in one chunk).
  bool adam_on_disk = false;
  int64_t host_adam = 0;
  int64_t dev_params = 0, dev_grads = 0, dev_adam = 0;

  // Full parameters gathered (compute dtype): the root, a layer, the extra units, the edge units, all of them,
  // and what stays gathered at the loss and as backward starts.
  bool gathers = false, reshard = false;
  int64_t root_g = 0, layer_g = 0, extra_g = 0, in_g = 0, out_g = 0, all_g = 0, held_g = 0;
  std::vector<int64_t> unit_g;  // each unit's, as Units::numel (float8 projections in one byte where gathered so)
  // Full gradients waiting for their reduction: the root's and the input edge unit's.
  bool replicated_fsdp = false, reduces = false;
  int64_t root_full_grads = 0, in_full_grads = 0;
  // A reduction overlaps the next unit's backward; DDP's buckets and what is in flight at the end of backward.
  bool overlap = false, ddp_buckets = false;
  std::vector<int64_t> buckets;
  size_t first_blocked = 0;
  int64_t comm = 0;

  // Activations: each layer's checkpointing and what it keeps to its backward; what the layers and the rest keep
  // on the device. Offloaded (job.activation_offload), what the layers keep is in host memory from forward to
  // backward (offloaded_activations), a layer's back on the device for its backward with the one below it.
  bool checkpointing = false, offload_activations = false;
  std::vector<bool> checkpoint;
  std::vector<int64_t> layer_kept;
  int64_t checkpointed = 0, kept_by_layers = 0, outside = 0, kept = 0, offloaded_activations = 0;

  // Gradient accumulation: what waits between micro-batches, what every phase holds (params, optimizer state and
  // that), the gradients a backward makes anew, and a tied table's gradient held apart from .grad.
  int64_t accumulated = 0, base = 0, new_grads = 0, tied_held = 0;

  // The bytes of a unit's reduce-scatter of `unit` trainable elements (input, output, the backend's scratch), and
  // of the reduction with its output installed beside it as the gradient shard, whichever holds more.
  int64_t reduce_scatter(int64_t unit) const;
  int64_t reduction(int64_t unit) const;
  // " / 4 ranks" when sharded, else "": what the terms' notes say a per-parameter size is divided by.
  std::string per_ranks() const { return shard > 1 ? " / " + std::to_string(shard) + " ranks" : ""; }
};

// What the recipe's activation function is asked for a job (the compute dtype, autocast under DDP's mixed
// precision, tensor parallelism, the data pipeline's masking).
models::ActivationQuery activation_query(const TrainingJob& job);

// Throws std::invalid_argument naming the value for a world that does not divide into its nodes, a batch, a
// checkpointing interval or a gradient accumulation below one.
StepLayout step_layout(const models::ModelRecipe& recipe, const ModelShape& shape, const TrainingJob& job);

// DDP's buckets (ddp::replicate): bytes per bucket in launch order, `first_blocked` the first holding a parameter
// the step gives no gradient (ready only at the end of backward); buckets.size() if none.
std::vector<int64_t> ddp_bucket_bytes(const std::vector<int64_t>& numel_in_order,
                                      const std::vector<char>& without_gradient, int64_t element_bytes, int64_t cap,
                                      size_t& first_blocked);
// Bytes of DDP's buckets in flight once `done` bytes of gradients are made.
int64_t ddp_in_flight(const std::vector<int64_t>& buckets, int64_t done, size_t first_blocked);

}  // namespace shardtrain::plan
