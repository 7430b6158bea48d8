// One unit of fully_shard: the communication group of a module's parameters, its state machine and its place in
// the module's call; and the RootState the units of one model share (private to the fsdp layer).
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <vector>

#include "fsdp/collectives.h"
#include "fsdp/fsdp_param.h"
#include "shardtrain/distributed/communicator.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::fsdp {

// Where a unit is in the step. Every change goes through FsdpUnit::Impl::set_training, which allows only
//   IDLE -> FORWARD -> IDLE                        a forward
//   IDLE -> PRE_BACKWARD -> POST_BACKWARD -> IDLE  a backward with gradient sync
//   PRE_BACKWARD -> IDLE                           a backward without sync (no_sync), or a unit without parameters
// and throws std::logic_error naming the unit and both states otherwise.
// A unit called more than once in a forward ([Note: a unit called twice] in fsdp_unit.cpp) stays PRE_BACKWARD from
// its first call's backward to its last, SHARDED between them.
enum class TrainingState {
  IDLE,           // between steps, or forward done
  FORWARD,        // inside the unit's forward
  PRE_BACKWARD,   // gathered for backward (or between two calls' backwards), waiting for its gradients
  POST_BACKWARD,  // gradients reduce-scattered (in flight), waiting for the end of backward
};

const char* training_state_name(TrainingState s);

// What the units of one model share: the order they ran in (for prefetching), the one end-of-backward callback,
// and the instrumentation. Created by each fully_shard call; a unit fully_shard'ed around others (the root) takes
// them into its own schedule. Holds units weakly: modules own their units.
struct RootState : std::enable_shared_from_this<RootState> {
  std::vector<std::weak_ptr<FsdpUnit::Impl>> units;         // registration order, the root last
  // The calls in pre-forward order of the previous forward (forward prefetch follows it: none in the first) and of
  // the one running; a unit called twice is there twice. A model whose path changes (FLAVA's batch kinds, Toy's
  // active_blocks) is followed from the next forward on; a unit it gathered ahead and did not run is dropped as
  // backward starts (drop_unused_prefetches).
  std::vector<std::weak_ptr<FsdpUnit::Impl>> forward_order;
  std::vector<std::weak_ptr<FsdpUnit::Impl>> running_forward_order;
  // The calls of the latest forward that have a backward, in the order they ended (a unit called twice is there
  // twice): backward prefetch follows it in reverse. `forwards` counts the root's forwards, so that a call of an
  // earlier forward does not read this one's order.
  std::vector<std::weak_ptr<FsdpUnit::Impl>> post_forward_order;
  int64_t forwards = 0;
  const FsdpUnit::Impl* root = nullptr;
  bool backward_callback_queued = false;
  // The unit whose reduce-scatter is in flight: waited for when the next one is issued, so one runs during the
  // backward of the next unit and at most one unit's full-size reduction input is alive.
  std::weak_ptr<FsdpUnit::Impl> reducing;
  int64_t reductions_in_flight = 0;
  FsdpStats stats;
  int64_t unsharded_units = 0;
  int64_t unsharded_bytes = 0;

  // Appends a call of `unit` to `order` and returns its place there, or -1 once `order` holds 64 calls per unit
  // (a unit called outside its root's forward, over and over, records nothing more until the root's next one).
  int64_t record_call(std::vector<std::weak_ptr<FsdpUnit::Impl>>& order, const std::shared_ptr<FsdpUnit::Impl>& unit);
  // How often `unit` is in `order`, and the unit `offset` places after its `occurrence`-th call there (from 0), or
  // nullptr.
  static int64_t calls_of(const std::vector<std::weak_ptr<FsdpUnit::Impl>>& order, const FsdpUnit::Impl* unit);
  static std::shared_ptr<FsdpUnit::Impl> after_call(const std::vector<std::weak_ptr<FsdpUnit::Impl>>& order,
                                                    const FsdpUnit::Impl* unit, int64_t occurrence, int offset);
  int64_t pending_gathers() const;
  void note_unsharded(int64_t units_delta, int64_t bytes_delta);
  void queue_backward_callback();
  // Waits for and drops the all-gathers still pending (prefetched in forward for a unit that did not run): at
  // the start of backward and at the root's next forward, so that they are not held through a backward.
  void drop_unused_prefetches();
  void finish_backward();  // the end-of-backward callback
};

// One forward call of a unit, as its backward sees it: shared by the hooks on the call's outputs and the node on
// its inputs (fsdp_unit.cpp), which may each fire several times.
struct CallBackward {
  bool started = false;  // an output's gradient arrived
  bool done = false;     // the inputs' gradients left
  int64_t post_forward_index = -1;  // its place in RootState::post_forward_order
  int64_t forward = -1;             // of RootState::forwards
};

struct FsdpUnit::Impl : std::enable_shared_from_this<FsdpUnit::Impl> {
  // `float8[i]`: the module whose float8 product reads params[i] (FsdpOptions::float8_all_gather), or null; empty
  // for none.
  Impl(std::string module_name, std::vector<std::pair<std::string, at::Tensor>> params, dist::Communicator group,
       FsdpOptions options, const std::vector<std::shared_ptr<torch::nn::Module>>& float8 = {});

  at::ScalarType compute_dtype() const;
  at::ScalarType reduce_dtype() const;
  // CPU offload: the shards, their gradients and the optimizer state beside them in host memory — pinned CPU
  // memory under a GPU, the CPU's HOST tier (memory/memory_stats.h) when computing on the CPU — copied to
  // compute_device for each gather and back after each reduction.
  bool offloaded() const { return options.offload_params; }
  bool overlaps_reduce_scatter() const {
    return options.overlap_reduce_scatter.value_or(overlaps_reduce_scatter_by_default(group.backend()));
  }
  // A shard group of one rank computing in the parameters' own dtype on their own device (world size 1,
  // NO_SHARD): the shards are the full parameters, so unsharding moves nothing and gradients need no
  // reduce-scatter.
  bool shards_are_full() const { return group.size() == 1 && compute_dtype() == own_dtype && !offloaded(); }
  // A divide factor replaces the group mean: reductions sum, install_gradients divides.
  dist::ReduceOp reduction_op() const {
    return options.gradient_divide_factor ? dist::ReduceOp::SUM : dist::ReduceOp::MEAN;
  }
  // Hybrid sharding / NO_SHARD over several replicas: reduced shards are all-reduced across them.
  bool has_replicas() const { return options.replicate_group && options.replicate_group->size() > 1; }
  // set_reshard_after_backward(false) applies to backward passes without gradient sync only.
  bool stays_unsharded_after_backward() const { return !reshard_after_backward && !requires_gradient_sync; }

  // The one place the training state changes; see TrainingState for the transitions allowed.
  void set_training(TrainingState next);

  // All-gathers: start_gather() issues one (asynchronously) unless one is pending; unshard() completes it (or
  // gathers now) and points the parameters at their full values; discard_gather() drops a pending one.
  void start_gather(bool prefetch);
  // Float8 all-gather: the float8 parameters' scales from the MAX over the shard group of their shards' amax (one
  // all-reduce), unless the shards are those they were computed from.
  void update_float8_scales();
  void unshard();
  void reshard();
  void discard_gather();
  // The parameters' full values in their own dtype (a collective; the unit's state does not change).
  std::vector<at::Tensor> gather_full_values() const;

  // Hooks of the autograd pass. `call`: the forward call whose outputs (inputs) the gradient reached.
  void on_output_gradient(CallBackward& call);  // a call's outputs got their gradient: gather for its backward
  void on_input_gradient(CallBackward& call);   // a call's backward is done: reshard if another call's is to come
  void on_parameter_gradient(size_t index);  // AccumulateGrad of parameter `index` ran
  void reduce_scatter_gradients();           // all gradients present (or backward ended): start the reduce-scatter
  void after_reduce_scatter(TrainingState next);  // the one epilogue of reduce_scatter_gradients' paths
  // Gloo: the MAX over the ranks (and replicas) of "has a gradient" per parameter; undefined on NCCL.
  at::Tensor agree_on_gradients(const std::vector<at::Tensor>& full) const;
  void max_over_ranks(at::Tensor& flags) const;  // in place: MAX over the shard group, then over the replicas
  void finish_reduction();                   // end of backward, first pass: wait, start the replicate all-reduce
  bool reduction_in_flight() const;          // this unit's reduce-scatter issued and not yet waited for
  void wait_reduce_scatter();                // a reduce-scatter in flight: wait, start the replicate all-reduce
  void move_reduced_home();                  // the reduced shards into the parameters' dtype, offloaded to the host
  void install_gradients();                  // end of backward, second pass: sharded gradients into .grad
  void rebind_grad_accumulators();           // after set_data() to another dtype or device: ours again
  // Issues the all-gathers of the next units that are sharded, within limit_all_gathers: in forward the
  // forward_prefetch calls after this unit's `occurrence`-th call in the previous forward's order; in backward
  // the call before backward_call_index in post-forward order.
  void prefetch_forward(int64_t occurrence);
  void prefetch_backward();
  void gather_ahead(const std::vector<std::shared_ptr<FsdpUnit::Impl>>& ahead);

  std::string module_name;
  dist::Communicator group;
  FsdpOptions options;
  at::ScalarType own_dtype = at::kFloat;  // the parameters' dtype: shards, optimizer state, gradients
  at::Device compute_device = at::kCPU;   // where the parameters were when sharded: gathers and gradients live here
  std::shared_ptr<RootState> schedule;
  std::vector<FsdpParam> params;
  std::vector<int64_t> offsets;  // each param's offset inside the unit's per-rank shard block
  std::optional<ByteLayout> float8_layout;  // set when some parameter gathers in float8: the gathers are in bytes
  // shard_version() the float8 scales were computed from; -1: none, or a backward has ended since (the optimizer
  // may have stepped without changing that version).
  int64_t float8_scales_version = -1;
  int64_t unit_shard_numel = 0;  // elements of this rank's shard block
  at::Tensor sharded_flat;       // (unit_shard_numel): the shards the optimizer updates, the parameters' dtype;
                                 // in host memory when offloaded, else on compute_device
  std::vector<at::Tensor> stashed_grads;  // the sharded .grad of each param while it is unsharded
  std::vector<at::Tensor> unreduced_grads;  // no_sync: full gradients summed over backward passes, reduce dtype
  // Each parameter's AccumulateGrad node with the hook that counts its gradient in (null: frozen), kept alive
  // here: tensors hold theirs weakly. `accumulating` of them are not null.
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators;
  size_t accumulating = 0;
  ShardState state = ShardState::SHARDED;
  TrainingState training = TrainingState::IDLE;
  bool requires_gradient_sync = true;
  bool reshard_after_backward = true;  // false: a backward without sync leaves the unit UNSHARDED
  size_t gradients_ready = 0;
  // The forward calls under grad mode since the last backward ended, and of their backwards those running (output
  // gradient in, input gradients not yet out) and those done. Only a call whose inputs require a gradient reports
  // its end; the others count as running to the end of backward.
  int64_t calls = 0, calls_in_backward = 0, calls_done = 0;
  // The call whose backward started last (its CallBackward's place): backward prefetch looks from there.
  int64_t backward_call_index = -1, backward_call_forward = -1;
  // An all-gather issued (a prefetch, or unshard's own) whose output the parameters have not taken yet.
  std::optional<AllGatherResult> pending_gather;
  // This backward's reduction, from the reduce-scatter until install_gradients: `output` the reduced gradient
  // shards of the parameters requiring a gradient (on Gloo only those some rank has one for), in the reduce
  // dtype, at `offsets`; `has_gradient` per parameter, 1 when this rank contributed one, or on Gloo when any rank
  // did (FSDP2: a parameter no rank computed a gradient for keeps grad undefined, so optimizers skip it, as they
  // would in one process); `work` until waited (at most one unit's reduce-scatter is in flight at a time).
  std::optional<ReduceScatterResult> reduction;
  // A group of one without replicas reduces nothing: each parameter's full gradient of this backward (undefined
  // where it got none), in the parameters' dtype, to be installed as its .grad at the end of backward.
  std::vector<at::Tensor> local_grads;
  dist::Work replicate_work;

 private:
  int64_t shard_version() const;
  int64_t full_bytes() const;
};

// The interceptor placed on the unit's module.
class FsdpInterceptor : public nn::Interceptor {
 public:
  explicit FsdpInterceptor(std::shared_ptr<FsdpUnit::Impl> unit) : unit_(std::move(unit)) {}
  nn::TensorVec around(torch::nn::Module& module, nn::TensorVec inputs, const Next& next) override;
  std::string name() const override { return "fully_shard"; }
  const std::shared_ptr<FsdpUnit::Impl>& unit() const { return unit_; }

 private:
  std::shared_ptr<FsdpUnit::Impl> unit_;
};

// The unit placed on `module`, or nullptr (fully_shard.cpp).
FsdpInterceptor* fsdp_interceptor_of(torch::nn::Module& module);
// The units inside `root` (itself included), in named_modules() order.
std::vector<std::shared_ptr<FsdpUnit::Impl>> unit_impls_of(const std::shared_ptr<torch::nn::Module>& root);
// The same, for operations over the whole model: throws std::invalid_argument prefixed by `caller` when there is
// no unit or when the units do not all shard over one group.
std::vector<std::shared_ptr<FsdpUnit::Impl>> units_sharing_one_group(const std::shared_ptr<torch::nn::Module>& root,
                                                                    const char* caller);

}  // namespace shardtrain::fsdp
