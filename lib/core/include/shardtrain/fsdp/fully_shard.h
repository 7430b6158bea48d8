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
// unit's forward and backward they hold the full value. See [Note: FSDP parameter storage] in lib/core/src/fsdp/fsdp_param.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/optim/row_sharding.h"
#include "shardtrain/parallel/vocabulary.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::fsdp {

// Mixed precision (FSDP2's MixedPrecisionPolicy plus FSDP1's buffer_dtype). The shards the optimizer updates keep
// the parameters' own dtype (float32 masters); gradients reach the optimizer in that dtype.
struct MixedPrecision {
  std::optional<at::ScalarType> param_dtype;   // all-gather and compute; unset: the parameters' own dtype
  std::optional<at::ScalarType> reduce_dtype;  // gradient reduce-scatter and all-reduce; unset: param_dtype
  std::optional<at::ScalarType> buffer_dtype;  // the unit's own buffers, cast once by fully_shard
  std::optional<at::ScalarType> output_dtype;  // floating outputs of the unit's forward
  bool cast_forward_inputs = true;             // floating inputs cast to param_dtype (when set)
};

// Which unit's all-gather is issued ahead during backward (FSDP's BackwardPrefetch).
enum class BackwardPrefetch {
  NONE,
  BACKWARD_PRE,   // when a unit's backward starts: most overlap, one more unit's parameters held
  BACKWARD_POST,  // when a unit's gradients are done: less overlap, less memory
};

struct FsdpOptions {
  // true: free the unit's full parameters after its forward and gather them again for backward (FULL_SHARD,
  // ZeRO-3) — except the root's, kept from its forward into the backward that follows (as FSDP2 does) unless
  // sharded gradients of an earlier backward are still there. false: keep them from forward until the unit's
  // backward is done (SHARD_GRAD_OP, ZeRO-2). A forward without grad mode reshards every unit.
  bool reshard_after_forward = true;
  // Ranks holding the same shards (the columns of a DeviceMesh): after the reduce-scatter inside the shard group,
  // the gradient shards are averaged across this group. Unset: the shard group is the whole data-parallel world.
  //   HYBRID_SHARD = shard group of a node + replicate group across nodes (mesh.shard_group(), mesh.replicate_group())
  //   NO_SHARD     = a shard group of size 1 + replicate group of every rank (parameters replicated, gradients
  //                  all-reduced, like DDP)
  std::optional<dist::Communicator> replicate_group;
  MixedPrecision mixed_precision;
  // Gradients are summed over every rank (shard x replicate group) and divided by this. Unset: the number of
  // ranks, i.e. the mean, which matches one process on the whole batch when every rank has an equal share.
  std::optional<double> gradient_divide_factor;
  // forward_prefetch = how many units ahead to gather while this one computes, in the order units ran in during
  // the previous forward (recorded per forward by the root unit, the one fully_shard'ed last around the others;
  // none in the first). When the path changes, a unit gathered ahead that does not run is dropped as backward
  // starts. Backward gathers the next unit in the reverse of this forward's order. limit_all_gathers bounds the
  // gathered-ahead units to one, so at most the running units and one more hold full parameters (FSDP's rate
  // limiter). With two ranks on two CPU cores forward prefetch bought nothing measurable (Llama W=2
  // SHARD_GRAD_OP, docs/notes/benchmarks.md): the gather's copies compete with compute for the same cores.
  int forward_prefetch = 0;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  bool limit_all_gathers = true;
  // Whether a unit's gradient reduce-scatter runs on while the next unit computes its backward (true), or is waited
  // for before it starts (false). Overlap hides the collective behind compute, but its buffers stay allocated
  // meanwhile: the flat input (the unit's full gradients) and on Gloo two received shards, on top of the next
  // unit's backward. Unset: overlap with NCCL (its reduce-scatter has no receive buffer and runs on its own
  // stream); wait with Gloo, where on CPU cores that both compute and communicate overlap bought 1.5-3% of the
  // step's time and cost up to two layers' gradients of peak (BERT W=4: 404 -> 379 MB, ViT W=2: 340 -> 334 MB,
  // measured when Gloo's reduce-scatter still received into a buffer as large as its input;
  // docs/notes/benchmarks.md): memory decides what fits.
  std::optional<bool> overlap_reduce_scatter;
  // CPU offload (FSDP2's CPUOffloadPolicy, Accelerate's fsdp_offload_params): the shards — what the optimizer reads
  // and updates, so also its state and the gradients it sees — live in CPU memory (pinned), each gather copies them
  // to the compute device first, and reduced gradients come back to the CPU; the optimizer steps on the CPU. The
  // compute device is where the parameters are when fully_shard is called; for a model on the CPU nothing moves.
  bool offload_params = false;
  // Float8 all-gather (torchao's enable_fsdp_float8_all_gather): the weights of the unit's float8 products
  // (modules that are nn::Float8CastAhead with a float8_weight()) are cast to e4m3 before the all-gather — one scale
  // for each whole weight, 448 over the MAX of the ranks' amax in the compute dtype, one all-reduce for the unit,
  // computed at the first gather after each backward (once a step, torchao's precomputed dynamic scale) or after
  // the shards change — and gathered so: one byte an element against bf16's two, and no compute-dtype copy of those
  // weights while unsharded. The product is the one a gather in the compute dtype then the layer's own cast
  // computes, bit for bit. The unit's other parameters gather in the compute dtype in the same collective.
  bool float8_all_gather = false;
};

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
  // Gathers the full parameters (collective over the group) / frees them again. Under float8_all_gather a float8
  // weight is then its module's cast (the parameter holds no value): gather_full_parameters reads values.
  void unshard();
  void reshard();
  // false: backward keeps this unit's full gradients (summed over backward passes) instead of reducing them;
  // the next backward with sync on reduces the sum. Gradient accumulation without communication (no_sync).
  void set_requires_gradient_sync(bool sync);

 private:
  std::shared_ptr<Impl> impl_;
};

// A strategy of PyTorch FSDP / Accelerate as a shard group and options on `mesh`: FULL_SHARD and SHARD_GRAD_OP
// shard over the data-parallel ranks (mesh.data_group(): the world without tensor parallelism);
// HYBRID_SHARD(_ZERO2) over mesh.shard_group() with mesh.replicate_group() across; NO_SHARD keeps every parameter
// whole (a shard group of this rank alone) and averages gradients over the data-parallel ranks. DDP is not FSDP's (ddp::replicate): std::invalid_argument.
struct StrategyGroups {
  dist::Communicator shard;
  FsdpOptions options;
};
StrategyGroups strategy_groups(parallel::Strategy strategy, const dist::DeviceMesh& mesh);

// The schedule's policies, one description for the runtime and the memory model (plan/), so that the model follows
// a change here: whether a strategy's units free their full parameters after forward (FULL_SHARD and HYBRID_SHARD;
// the others keep them to backward, NO_SHARD having nothing to free) — what strategy_groups sets —, and whether a
// unit's reduce-scatter runs on while the next unit computes when FsdpOptions::overlap_reduce_scatter is unset (with
// NCCL; waited for with Gloo).
bool reshards_after_forward(parallel::Strategy strategy);
bool overlaps_reduce_scatter_by_default(dist::CommBackend backend);

// Makes `module` a unit sharded over `group`. Throws std::invalid_argument naming the module when it is not an
// nn::Interceptable or is already a unit. Every rank must apply the same units in the same order.
FsdpUnit fully_shard(const std::shared_ptr<torch::nn::Module>& module, const dist::Communicator& group,
                     const FsdpOptions& options = {});

// set_requires_gradient_sync on every unit inside `root`.
void set_requires_gradient_sync(const std::shared_ptr<torch::nn::Module>& root, bool sync);

// FSDP2's set_reshard_after_backward for every unit inside `root`. false: a backward without gradient sync
// leaves each unit's parameters unsharded, so the next micro-batch's forward (and, without resharding after
// forward, its backward) gathers nothing — communication traded for memory during gradient accumulation. A
// backward with gradient sync always reshards, whatever this says: the optimizer steps the shards. Default true.
void set_reshard_after_backward(const std::shared_ptr<torch::nn::Module>& root, bool reshard);

// Gradient accumulation without communication for the guard's lifetime (PyTorch's `with model.no_sync():`):
//   { fsdp::NoSync no_sync(model.ptr()); loss(micro_batch_1).backward(); }   // full gradients kept locally
//   loss(micro_batch_2).backward();                                           // reduces the sum of both
class NoSync {
 public:
  explicit NoSync(std::shared_ptr<torch::nn::Module> root);
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  std::shared_ptr<torch::nn::Module> root_;
};

// The runtime's own instrumentation for the units of one root (the unit fully_shard'ed around the others).
struct FsdpStats {
  int64_t all_gathers = 0;           // parameter all-gathers issued (prefetched ones included)
  int64_t all_gather_bytes = 0;      // what those all-gathers brought in (W x a rank's block), summed
  int64_t prefetches = 0;            // all-gathers issued ahead of the unit's use
  int64_t stale_prefetches = 0;      // prefetched shards changed before use (gathered again)
  int64_t reduce_scatters = 0;       // gradient reduce-scatters issued (none by a group of one without replicas)
  int64_t peak_reductions_in_flight = 0;  // most reduce-scatters issued and not yet waited for (full-size inputs)
  int64_t reduce_scatter_input_bytes = 0;  // the reduce-scatters' inputs, summed (frozen parameters take none)
  int64_t overlapped_reduce_scatters = 0;  // still in flight when the next unit's gradients were complete
  int64_t peak_unsharded_units = 0;  // most units holding (or gathering) full parameters at once
  int64_t peak_unsharded_bytes = 0;  // most bytes of full parameters held (or being gathered) at once
  int64_t reshards_between_calls = 0;  // a unit called twice, resharded between its calls' backwards
};
FsdpStats fsdp_stats(const std::shared_ptr<torch::nn::Module>& root);
void reset_fsdp_stats(const std::shared_ptr<torch::nn::Module>& root);

// The units inside `root` (itself included), in named_modules() order.
std::vector<FsdpUnit> units_of(const std::shared_ptr<torch::nn::Module>& root);

// How the parameters of `root`'s units are split by rows over their shard group, for an optimizer whose statistics
// span whole parameters (optim::Adafactor). std::invalid_argument when the units shard over more than one group.
optim::RowSharding row_sharding(const std::shared_ptr<torch::nn::Module>& root);

// Scales the gradients of `root`'s units so that their global L2 norm — over every shard of every rank, as if
// the model were whole — is at most `max_norm`; returns that norm before clipping (torch.nn.utils.clip_grad_norm_
// semantics). Collective over the units' shard group, which must be the same for every unit. `stages`: a pipeline's
// group (DeviceMesh::pp_group), whose ranks hold the model's other layers — their squares join the norm.
double clip_grad_norm(const std::shared_ptr<torch::nn::Module>& root, double max_norm,
                      const dist::Communicator* stages = nullptr);

// Every parameter of `root` at full size, by name (a copy), gathered unit by unit. Collective: every rank calls it.
std::map<std::string, at::Tensor> gather_full_parameters(const std::shared_ptr<torch::nn::Module>& root);

}  // namespace shardtrain::fsdp
