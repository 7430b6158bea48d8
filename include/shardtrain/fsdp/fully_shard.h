// fully_shard: FSDP2's per-module sharding for LibTorch modules.
//
// Intended usage (inner units first, then the root, as in FSDP2 and torchtitan):
//   for (auto& block : model->blocks) fsdp::fully_shard(block.ptr(), mesh.shard_group());
//   fsdp::fully_shard(model.ptr(), mesh.shard_group());
//   torch::optim::AdamW optimizer(model->parameters(), ...);   // sees this rank's shards
//   loss = loss_fn(model(x)); loss.backward(); optimizer.step(); // gradients arrive sharded and averaged
//
// A unit is a module deriving from nn::Interceptable (nn/intercept.h). Its parameters — those not owned by a unit
// inside it — are sharded on dim 0 over the group (padded to a multiple of the group size). The module keeps its
// own parameter tensors: between steps they hold this rank's shard, which is what the optimizer sees; around the
// unit's forward and backward they hold the full value. See [Note: FSDP parameter storage] in src/fsdp/fsdp_param.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/dist/communicator.h"
#include "shardtrain/dist/mesh.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::fsdp {

struct FsdpOptions {
  // true: free the unit's full parameters after its forward and gather them again for backward (FULL_SHARD,
  // ZeRO-3). false: keep them from forward until the unit's backward is done (SHARD_GRAD_OP, ZeRO-2).
  bool reshard_after_forward = true;
  // Ranks holding the same shards (the columns of a DeviceMesh): after the reduce-scatter inside the shard group,
  // the gradient shards are averaged across this group. Unset: the shard group is the whole data-parallel world.
  //   HYBRID_SHARD = shard group of a node + replicate group across nodes (mesh.shard_group(), mesh.replicate_group())
  //   NO_SHARD     = a shard group of size 1 + replicate group of every rank (parameters replicated, gradients
  //                  all-reduced, like DDP)
  std::optional<dist::Communicator> replicate_group;
};

// The sharding strategies of PyTorch FSDP / Accelerate, expressed as FsdpOptions over a mesh.
enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 };

// Memory effect of each state, per rank: SHARDED holds the shards only; UNSHARDED adds the full parameters.
enum class ShardState { SHARDED, UNSHARDED };

// A handle on one unit, for inspection and explicit unshard/reshard.
class FsdpUnit {
 public:
  struct Impl;
  explicit FsdpUnit(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  ShardState state() const;
  const std::string& module_name() const;  // the module's class name
  std::vector<std::string> parameter_names() const;
  int64_t sharded_numel() const;  // elements of all this unit's shards on this rank (padding included)
  int64_t full_numel() const;     // elements of the unit's parameters, unsharded
  // Gathers the full parameters (collective over the group) / frees them again.
  void unshard();
  void reshard();

 private:
  std::shared_ptr<Impl> impl_;
};

// A strategy of PyTorch FSDP / Accelerate as a shard group and options on `mesh`: FULL_SHARD and SHARD_GRAD_OP
// shard over the whole world (mesh.world()); HYBRID_SHARD(_ZERO2) over mesh.shard_group() with
// mesh.replicate_group() across; NO_SHARD keeps every parameter whole (a shard group of this rank alone) and
// averages gradients over the world.
struct StrategyGroups {
  dist::Communicator shard;
  FsdpOptions options;
};
StrategyGroups strategy_groups(ShardingStrategy strategy, const dist::DeviceMesh& mesh);

// Makes `module` a unit sharded over `group`. Throws std::invalid_argument naming the module when it is not an
// nn::Interceptable or is already a unit. Every rank must apply the same units in the same order.
FsdpUnit fully_shard(const std::shared_ptr<torch::nn::Module>& module, const dist::Communicator& group,
                     const FsdpOptions& options = {});

// The units inside `root` (itself included), in named_modules() order.
std::vector<FsdpUnit> units_of(const std::shared_ptr<torch::nn::Module>& root);

// Scales the gradients of `root`'s units so that their global L2 norm — over every shard of every rank, as if
// the model were whole — is at most `max_norm`; returns that norm before clipping (torch.nn.utils.clip_grad_norm_
// semantics). Collective over the units' shard group, which must be the same for every unit.
double clip_grad_norm(const std::shared_ptr<torch::nn::Module>& root, double max_norm);

// Every parameter of `root` at full size, by name (a copy), gathered unit by unit. Collective: every rank calls it.
std::map<std::string, at::Tensor> gather_full_parameters(const std::shared_ptr<torch::nn::Module>& root);

}  // namespace shardtrain::fsdp
