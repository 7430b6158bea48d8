// parallelize(): how a model of the zoo becomes a data-parallel model, torchtitan style. In this order:
//   0. activation checkpointing on every activation_checkpoint_every-th transformer layer
//      (nn/activation_checkpoint.h), which
//      stays inside the layer's unit whatever the order: the replay runs while the unit is gathered;
//   1. FSDP units: fully_shard on every transformer layer (the family's layer class, or the classes given —
//      Accelerate's fsdp_transformer_layer_cls_to_wrap) and on the family's own units (FLAVA's frozen codebook:
//      ModelRecipe::extra_unit_classes; Llama's embedding and head: edge_unit_classes), innermost first;
//   2. the root unit, which takes the embeddings, heads and everything else;
//   3. the family's parallelize_hook (models/recipe.h; FLAVA: the global contrastive loss gathers over the
//      data-parallel world).
//
// build_parallel() does the same while the model is built: each layer is sharded as soon as it exists, so a rank
// never holds more than one unsharded layer plus its shards (how flava-10b is built on GPUs smaller than 40 GB).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardtrain/distributed/mesh.h"
#include "shardtrain/ddp/replicate.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/models/zoo.h"

namespace shardtrain::models {

struct ParallelizeOptions {
  parallel::Strategy strategy = parallel::Strategy::FULL_SHARD;
  // Mixed precision, prefetching, limit_all_gathers, gradient divide factor. The strategy sets
  // reshard_after_forward and replicate_group (fsdp::strategy_groups).
  fsdp::FsdpOptions fsdp;
  std::vector<std::string> layer_classes;  // the units; empty: the family's transformer layer ("FlavaLayer")
  // Another wrap policy instead of layer_classes (by size, by predicate, none); parallelize() only.
  std::optional<fsdp::WrapPolicy> policy;
  // Activation checkpointing of the layers of layer_classes: 0 none; 1 every layer (Accelerate's
  // fsdp_activation_checkpointing, torchtitan's full AC); k the k-th, 2k-th, ... (torchtitan's selective layer AC:
  // memory traded for compute in steps).
  int64_t activation_checkpoint_every = 0;
  // Activation offloading of the layers of layer_classes (nn/activation_offload.h), inside their units.
  bool activation_offload = false;
};

// Activation checkpointing on the k-th, 2k-th, ... transformer layer of the model (counted in named_modules order
// from 1) of `layer_classes` (empty: the family's layer); returns their names. For models that are replicated or
// not parallelized; parallelize() and build_parallel() apply ParallelizeOptions::activation_checkpoint_every
// themselves.
// Throws std::invalid_argument for every < 1.
std::vector<std::string> activation_checkpoint_layers(ZooModel& model, int64_t every,
                                           const std::vector<std::string>& layer_classes = {});

// Activation offloading on every transformer layer of `layer_classes` (empty: the family's layer), one schedule for
// them all (nn/activation_offload.h); returns their names. Applied after fully_shard or replicate, it sits inside
// them; parallelize() and build_parallel() apply ParallelizeOptions::activation_offload themselves. Throws
// std::invalid_argument when the model has no such layer.
std::vector<std::string> activation_offload_layers(ZooModel& model, const std::vector<std::string>& layer_classes = {});

// Shards an unsharded model of the zoo. Returns the units, root last. Collective: every rank calls it alike.
std::vector<fsdp::FsdpUnit> parallelize(ZooModel& model, const dist::DeviceMesh& mesh,
                                        const ParallelizeOptions& options);

// DDP instead of FSDP: every rank holds the whole model, gradients are all-reduced in buckets (ddp/replicate.h);
// FLAVA's contrastive loss gathers over the world. Collective.
ddp::Ddp replicate_model(ZooModel& model, const dist::DeviceMesh& mesh, const ddp::DdpOptions& options = {});

// build_model + parallelize with each layer sharded as it is built (same weights: they depend on the seed and
// names only). Throws std::invalid_argument when options.layer_classes names a class that is not the family's
// transformer layer (those need the whole model first: use parallelize).
ZooModel build_parallel(const std::string& flavor, const dist::DeviceMesh& mesh, const ParallelizeOptions& options,
                        BuildOptions build = {});
ZooModel build_parallel(std::shared_ptr<const ModelRecipe> recipe, const dist::DeviceMesh& mesh,
                        const ParallelizeOptions& options, BuildOptions build = {});

// build_parallel on a mesh with a tensor dimension: each layer split over mesh.tp_group() as soon as it is built
// (models/tensor_parallel.h's TensorParallelizer), then sharded over the data-parallel ranks; the rest of the model
// split, then its units sharded. A rank holds at most one whole layer beside its slices and shards. The same model
// as build_model + tensor_parallelize + parallelize.
struct TensorParallelModel {
  ZooModel model;
  TensorParallel tp;
};
TensorParallelModel build_tensor_parallel(std::shared_ptr<const ModelRecipe> recipe, const dist::DeviceMesh& mesh,
                                          const ParallelizeOptions& options, const TensorParallelOptions& tp_options,
                                          BuildOptions build = {});

}  // namespace shardtrain::models
