// The model of a run, sharded (an FSDP strategy) or replicated (DDP) as the config says (private to the train
// layer). The config's strategy, precision and prefetch enums map onto the runtime's here and nowhere else.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <torch/optim/optimizer.h>

#include <optional>

#include "shardtrain/config/config.h"
#include "shardtrain/ddp/replicate.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/models/float8.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/optim/row_sharding.h"

namespace shardtrain::train {

at::ScalarType scalar_type_of(config::Dtype dtype);

class ParallelModel {
 public:
  // Builds the recipe's model on `device` and parallelizes it (each layer sharded as it is built when the units
  // are the family's layers), loads model.init_weights when given, then applies the family's parallelize hook.
  // With parallel.tp_size above 1 each layer is split over the mesh's tensor-parallel group as it is built, then
  // sharded over the data-parallel ranks (models::build_tensor_parallel), and init_weights is read as each rank's
  // slices; under DDP the model is built whole, loaded, split, then replicated. With `stages` (a pipeline rank's
  // runs of layers, models::BuildOptions::stages) only those are built, sharded over the stage's data-parallel ranks;
  // the gradient norm then spans the mesh's pipeline group. Collective over the mesh.
  ParallelModel(const config::Config& config, std::shared_ptr<const models::ModelRecipe> recipe, bool has_unused,
                const dist::DeviceMesh& mesh, const at::Device& device,
                std::vector<models::StageLayers> stages = {});

  models::ZooModel& zoo() { return model_; }
  const std::shared_ptr<torch::nn::Module>& module() const { return model_.module; }
  bool sharded() const { return !ddp_.has_value(); }
  at::ScalarType dtype() const { return dtype_; }  // the parameters' (model.dtype): batches' pixels are cast to it
  // What loading model.init_weights left aside: task heads initialized, other tasks' heads unused (rank 0's).
  const models::LoadReport& load_report() const { return load_report_; }

  // Tensor parallelism's handle; null without.
  const models::TensorParallel* tensor_parallel() const { return tp_ ? &*tp_ : nullptr; }
  // train.fp8: which projections compute in float8 (null without it).
  const models::Float8Layers* float8() const { return float8_ ? &*float8_ : nullptr; }

  // Whether the next backward reduces gradients (false: they accumulate locally; gradient accumulation).
  void set_gradient_sync(bool sync);
  // After the step's last backward: the gradients each tensor-parallel rank holds a part of are summed over its
  // group (models::TensorParallel::reduce_gradients). Nothing without tensor parallelism.
  void finish_gradients();
  // Scales the gradients so that their global norm is at most max_norm (INFINITY: measure only); returns the norm
  // before clipping. `groups` are the optimizer's (DDP: each rank holds every gradient whole, and those of the
  // optimizer's parameters are clipped; FSDP: every unit's shards).
  double clip_grad_norm(double max_norm, const std::vector<torch::optim::OptimizerParamGroup>& groups);
  // How the parameters the optimizer steps are split by rows across the shard group (FSDP); none under DDP.
  std::optional<optim::RowSharding> row_sharding() const;
  // How tensor parallelism split them; none without it.
  std::optional<optim::TensorSplit> tensor_split() const;
  // The ranks that hold this rank's parameters too (parallel.check_replicas_every): DDP's data-parallel ranks, the
  // replicate group of hybrid_shard and no_shard; none where no other rank does (FULL_SHARD, SHARD_GRAD_OP, one
  // data-parallel rank).
  const std::optional<dist::Communicator>& replicas() const { return replicas_; }

 private:
  models::ZooModel model_;
  std::optional<ddp::Ddp> ddp_;
  std::optional<models::TensorParallel> tp_;
  std::optional<models::Float8Layers> float8_;
  std::optional<dist::Communicator> shard_group_;  // FSDP's, under tensor parallelism (its clipping sums over it)
  std::optional<dist::Communicator> pp_group_;     // a pipeline's: the other stages' squares join the norm
  std::optional<dist::Communicator> replicas_;
  at::ScalarType dtype_ = at::kFloat;
  models::LoadReport load_report_;
};

}  // namespace shardtrain::train
