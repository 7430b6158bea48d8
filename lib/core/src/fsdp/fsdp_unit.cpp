#include "fsdp/fsdp_unit.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <stdexcept>

#include "nn/after_accumulate.h"
#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::fsdp {
namespace {

const char* state_name(ShardState s) { return s == ShardState::SHARDED ? "SHARDED" : "UNSHARDED"; }

at::Tensor cast_if_floating(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  if (!dtype || !t.defined() || !t.is_floating_point() || t.scalar_type() == *dtype) return t;
  return t.to(*dtype);
}

// Adds `g` to the parameter's .grad (accumulation across steps without zero_grad, as .grad does).
void accumulate_grad(at::Tensor& grad, at::Tensor g) {
  if (grad.defined()) {
    grad.add_(g);
  } else {
    grad = std::move(g);
  }
}

// [Note: a unit called twice]
// A unit may be called more than once in a forward: FLAVA runs its image and text encoders unmasked (for the
// contrastive loss) and masked (for the rest), every encoder layer twice. Autograd sums a parameter's
// contributions from both calls before its AccumulateGrad runs, once, in the backward of the call that ran first;
// so the backward of the later call leaves the unit's gradients partial, in the engine's buffers, and the unit's
// reduction waits. Kept gathered until then, an encoder's layers were all gathered at once between the two
// backwards (at 10B, 64 layers of 59M parameters: 7.5 GB in bf16 beside the 7.5 GB of partial gradients). As
// FSDP2 does, the unit reshards when a call's backward is done and no gradient of it is complete yet, and gathers
// again when the next call's backward starts: one all-gather more per extra call, one unit gathered at a time.
// A call's backward is done when its inputs' gradients leave it: CallEndNode, an identity placed on the inputs
// that require a gradient. Autograd's engine runs, of the nodes ready, the most recently created first, and an
// AccumulateGrad before any other, so by the time the node runs every node of the call has — an AccumulateGrad
// completed by this call among them (then the unit is reduced already, and nothing is left to do). A call whose
// inputs need no gradient never reports its end; while one runs, nothing reshards.

// Identity on a call's inputs that require a gradient; its backward reports the call's end to the unit.
class CallEndNode : public torch::autograd::Node {
 public:
  CallEndNode(std::weak_ptr<FsdpUnit::Impl> unit, std::shared_ptr<CallBackward> call)
      : unit_(std::move(unit)), call_(std::move(call)) {}
  std::string name() const override { return "fully_shard::CallEnd"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (auto u = unit_.lock()) u->on_input_gradient(*call_);
    return std::move(grads);
  }

 private:
  std::weak_ptr<FsdpUnit::Impl> unit_;
  std::shared_ptr<CallBackward> call_;
};

}  // namespace

const char* training_state_name(TrainingState s) {
  switch (s) {
    case TrainingState::IDLE: return "IDLE";
    case TrainingState::FORWARD: return "FORWARD";
    case TrainingState::PRE_BACKWARD: return "PRE_BACKWARD";
    case TrainingState::POST_BACKWARD: return "POST_BACKWARD";
  }
  return "?";
}

// ---- RootState ----

int64_t RootState::record_call(std::vector<std::weak_ptr<FsdpUnit::Impl>>& order,
                               const std::shared_ptr<FsdpUnit::Impl>& unit) {
  if (order.size() >= 64 * units.size()) return -1;
  order.push_back(unit);
  return static_cast<int64_t>(order.size()) - 1;
}

int64_t RootState::calls_of(const std::vector<std::weak_ptr<FsdpUnit::Impl>>& order, const FsdpUnit::Impl* unit) {
  return std::count_if(order.begin(), order.end(), [unit](const auto& weak) { return weak.lock().get() == unit; });
}

std::shared_ptr<FsdpUnit::Impl> RootState::after_call(const std::vector<std::weak_ptr<FsdpUnit::Impl>>& order,
                                                     const FsdpUnit::Impl* unit, int64_t occurrence, int offset) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].lock().get() != unit || occurrence-- > 0) continue;
    const int64_t j = static_cast<int64_t>(i) + offset;
    if (j < 0 || j >= static_cast<int64_t>(order.size())) return nullptr;
    return order[j].lock();
  }
  return nullptr;
}

int64_t RootState::pending_gathers() const {
  int64_t n = 0;
  for (const auto& weak : units) {
    if (auto u = weak.lock(); u && u->pending_gather) ++n;
  }
  return n;
}

void RootState::note_unsharded(int64_t units_delta, int64_t bytes_delta) {
  unsharded_units += units_delta;
  unsharded_bytes += bytes_delta;
  stats.peak_unsharded_units = std::max(stats.peak_unsharded_units, unsharded_units);
  stats.peak_unsharded_bytes = std::max(stats.peak_unsharded_bytes, unsharded_bytes);
}

void RootState::drop_unused_prefetches() {
  for (const auto& weak : units) {
    if (auto u = weak.lock(); u && u->state == ShardState::SHARDED) u->discard_gather();
  }
}

void RootState::queue_backward_callback() {
  if (backward_callback_queued) return;
  drop_unused_prefetches();  // the first unit of this backward: no backward prefetch issued yet
  std::weak_ptr<RootState> weak = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto schedule = weak.lock()) schedule->finish_backward();
  });
  backward_callback_queued = true;
}

void RootState::finish_backward() {
  backward_callback_queued = false;
  std::vector<std::shared_ptr<FsdpUnit::Impl>> live;
  for (const auto& weak : units) {
    if (auto u = weak.lock()) live.push_back(std::move(u));
  }
  for (auto& u : live) u->calls = u->calls_in_backward = u->calls_done = 0;
  // Two passes so that the replicate all-reduces of all units are in flight together.
  for (auto& u : live) u->finish_reduction();
  for (auto& u : live) u->install_gradients();
  reducing.reset();
  for (auto& u : live) {
    u->discard_gather();  // a prefetch for a unit that took no part in this backward
    if (!u->stays_unsharded_after_backward()) u->reshard();
    // The optimizer steps next, and may write the shards through aliases whose version counters are their own
    // (Tensor::data()): the float8 scales are computed again at the next gather.
    u->float8_scales_version = -1;
  }
}

// ---- Unit ----

FsdpUnit::Impl::Impl(std::string name, std::vector<std::pair<std::string, at::Tensor>> named_params,
                     dist::Communicator comm, FsdpOptions opts,
                     const std::vector<std::shared_ptr<torch::nn::Module>>& float8)
    : module_name(std::move(name)), group(std::move(comm)), options(std::move(opts)) {
  if (!named_params.empty()) {
    own_dtype = named_params.front().second.scalar_type();
    compute_device = named_params.front().second.device();
  }
  for (auto& [param_name, tensor] : named_params) {
    if (tensor.scalar_type() != named_params.front().second.scalar_type() ||
        tensor.device() != named_params.front().second.device()) {
      throw std::invalid_argument("fully_shard(" + module_name + "): parameter '" + param_name + "' is " +
                                  c10::toString(tensor.scalar_type()) + " on " + c10::str(tensor.device()) +
                                  ", the unit's first parameter '" + named_params.front().first + "' is " +
                                  c10::toString(named_params.front().second.scalar_type()) + " on " +
                                  c10::str(named_params.front().second.device()) + "; one unit holds one dtype");
    }
    offsets.push_back(unit_shard_numel);
    params.emplace_back(param_name, tensor, group.size(), group.rank(), compute_dtype());
    unit_shard_numel += params.back().shard_numel();
    const size_t i = params.size() - 1;
    if (i < float8.size() && float8[i]) {
      params.back().gather_in_float8(float8[i], dynamic_cast<nn::Float8CastAhead*>(float8[i].get()));
    }
  }
  const bool any_float8 = std::any_of(params.begin(), params.end(), [](const FsdpParam& p) { return p.in_float8(); });
  if (any_float8) float8_layout = byte_layout(params);
  if (options.gradient_divide_factor && !(*options.gradient_divide_factor > 0)) {
    throw std::invalid_argument("fully_shard(" + module_name + "): gradient_divide_factor = " +
                                std::to_string(*options.gradient_divide_factor) + ", expected > 0");
  }
  if (options.forward_prefetch < 0) {
    throw std::invalid_argument("fully_shard(" + module_name + "): forward_prefetch = " +
                                std::to_string(options.forward_prefetch) + ", expected >= 0");
  }
  stashed_grads.resize(params.size());
  unreduced_grads.resize(params.size());
}

at::ScalarType FsdpUnit::Impl::compute_dtype() const { return options.mixed_precision.param_dtype.value_or(own_dtype); }

at::ScalarType FsdpUnit::Impl::reduce_dtype() const {
  return options.mixed_precision.reduce_dtype.value_or(compute_dtype());
}

int64_t FsdpUnit::Impl::shard_version() const {
  int64_t v = sharded_flat.defined() ? sharded_flat._version() : 0;
  for (const auto& p : params) v += p.param()._version();
  return v;
}

int64_t FsdpUnit::Impl::full_bytes() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.unsharded_bytes();
  return n;
}

void FsdpUnit::Impl::set_training(TrainingState next) {
  using S = TrainingState;
  const S from = training;
  const bool allowed = (from == S::IDLE && (next == S::FORWARD || next == S::PRE_BACKWARD)) ||
                       (from == S::FORWARD && next == S::IDLE) ||
                       (from == S::PRE_BACKWARD && (next == S::POST_BACKWARD || next == S::IDLE)) ||
                       (from == S::POST_BACKWARD && next == S::IDLE);
  if (!allowed) {
    throw std::logic_error("fully_shard(" + module_name + "): training state " + training_state_name(from) + " -> " +
                           training_state_name(next) + " is not a valid transition");
  }
  training = next;
}

void FsdpUnit::Impl::start_gather(bool prefetch) {
  if (params.empty() || pending_gather || state == ShardState::UNSHARDED || shards_are_full()) return;
  RECORD_USER_SCOPE("FSDP::all_gather");
  if (float8_layout) {
    update_float8_scales();
    pending_gather = foreach_all_gather_bytes(sharded_flat, shard_version(), compute_dtype(), compute_device,
                                              offloaded(), group, params, offsets, *float8_layout);
  } else {
    pending_gather =
        foreach_all_gather(sharded_flat, shard_version(), compute_dtype(), compute_device, offloaded(), group);
  }
  ++schedule->stats.all_gathers;
  schedule->stats.all_gather_bytes += pending_gather->gathered.nbytes();
  if (prefetch) ++schedule->stats.prefetches;
  schedule->note_unsharded(1, full_bytes());
}

void FsdpUnit::Impl::update_float8_scales() {
  const int64_t version = shard_version();
  if (float8_scales_version >= 0 && version == float8_scales_version) return;
  RECORD_USER_SCOPE("FSDP::float8_scales");
  std::vector<at::Tensor> amax;
  for (const FsdpParam& p : params) {
    if (p.in_float8()) amax.push_back(p.shard_amax(compute_dtype()));
  }
  at::Tensor all = at::stack(amax).to(group.device());
  group.all_reduce(all, dist::ReduceOp::MAX).wait();  // replicas hold the same shards: their amax is this one
  const at::Tensor scales = nn::float8_scale(all, at::kFloat8_e4m3fn, /*power_of_2_scale=*/false).to(compute_device);
  int64_t k = 0;
  for (FsdpParam& p : params) {
    if (p.in_float8()) p.set_float8_scale(scales[k++]);
  }
  float8_scales_version = version;
}

void FsdpUnit::Impl::discard_gather() {
  if (!pending_gather) return;
  pending_gather->work.wait();  // a collective cannot be withdrawn: every rank completes it
  pending_gather.reset();
  schedule->note_unsharded(-1, -full_bytes());
}

void FsdpUnit::Impl::unshard() {
  if (state == ShardState::UNSHARDED) return;
  // The sharded gradients wait aside while the parameters hold their full values (AccumulateGrad then starts
  // from an empty .grad of the full shape).
  for (size_t i = 0; i < params.size(); ++i) {
    stashed_grads[i] = params[i].param().grad();
    params[i].grad() = at::Tensor();
  }
  if (!params.empty() && shards_are_full()) {
    for (auto& p : params) p.use_shard_as_full();
    schedule->note_unsharded(1, full_bytes());
  } else if (!params.empty()) {
    if (pending_gather && shard_version() != pending_gather->shard_version) {
      ++schedule->stats.stale_prefetches;  // the shards changed after the prefetch was issued
      discard_gather();
    }
    start_gather(/*prefetch=*/false);
    RECORD_USER_SCOPE("FSDP::all_gather_copy_out");  // waits for the gather first
    foreach_all_gather_copy_out(*pending_gather, params, offsets, unit_shard_numel);
    pending_gather.reset();  // still counted as unsharded until reshard()
    rebind_grad_accumulators();
  }
  state = ShardState::UNSHARDED;
}

void FsdpUnit::Impl::rebind_grad_accumulators() {
  // set_data() to another dtype or device (mixed precision's compute dtype, an offloaded shard's compute device)
  // drops the parameter's cached AccumulateGrad node, and autograd makes a fresh one at the next use — without the
  // hook that counts the gradient in: the unit would never see its gradients complete and stay gathered, its
  // reduction not started, until the end of backward. The full value's dtype and device are those the nodes were
  // made with (install_unit), so ours take the gradients again.
  if (compute_dtype() == own_dtype && !offloaded()) return;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grad_accumulators[i]) continue;
    torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(params[i].param());
    std::lock_guard<std::mutex> lock(meta->mutex_);
    meta->grad_accumulator_ = grad_accumulators[i];
  }
}

void FsdpUnit::Impl::reshard() {
  if (state == ShardState::SHARDED) return;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].use_sharded();
    params[i].grad() = std::move(stashed_grads[i]);
    stashed_grads[i] = at::Tensor();
  }
  state = ShardState::SHARDED;
  if (!params.empty()) schedule->note_unsharded(-1, -full_bytes());
}

std::vector<at::Tensor> FsdpUnit::Impl::gather_full_values() const {
  std::vector<at::Tensor> full;
  if (params.empty()) return full;
  AllGatherResult all =
      foreach_all_gather(sharded_flat, shard_version(), own_dtype, compute_device, offloaded(), group);
  all.work.wait();
  for (size_t i = 0; i < params.size(); ++i) {
    full.push_back(params[i].full_from_gathered(all.gathered, unit_shard_numel, offsets[i]));
  }
  return full;
}

// Backward runs the calls in the reverse of the order they ended in: the call that ended before the one whose
// backward runs now is next (FSDP2 too keeps each call's place, so that a unit called twice prefetches what
// precedes each of its calls).
void FsdpUnit::Impl::prefetch_backward() {
  const auto& order = schedule->post_forward_order;
  const int64_t before = backward_call_index - 1;
  if (backward_call_forward != schedule->forwards || before < 0 || before >= static_cast<int64_t>(order.size())) return;
  gather_ahead({order[before].lock()});
}

void FsdpUnit::Impl::prefetch_forward(int64_t occurrence) {
  std::vector<std::shared_ptr<FsdpUnit::Impl>> ahead;
  for (int k = 1; k <= options.forward_prefetch; ++k) {
    ahead.push_back(RootState::after_call(schedule->forward_order, this, occurrence, k));
  }
  gather_ahead(ahead);
}

void FsdpUnit::Impl::gather_ahead(const std::vector<std::shared_ptr<FsdpUnit::Impl>>& ahead) {
  for (const std::shared_ptr<FsdpUnit::Impl>& next : ahead) {
    if (!next) break;
    if (next->state == ShardState::UNSHARDED || next->pending_gather) continue;
    if (options.limit_all_gathers && schedule->pending_gathers() >= 1) break;
    next->start_gather(/*prefetch=*/true);
  }
}

void FsdpUnit::Impl::on_output_gradient(CallBackward& call) {
  schedule->queue_backward_callback();
  if (!call.started) {
    call.started = true;
    ++calls_in_backward;
  }
  backward_call_index = call.post_forward_index;  // where backward prefetch looks from
  backward_call_forward = call.forward;
  if (training == TrainingState::POST_BACKWARD) return;
  if (training == TrainingState::PRE_BACKWARD) {
    if (state == ShardState::UNSHARDED) return;
    unshard();  // resharded after another call's backward (on_input_gradient): gathered again for this one's
  } else {
    unshard();
    set_training(TrainingState::PRE_BACKWARD);
    gradients_ready = 0;
  }
  if (options.backward_prefetch == BackwardPrefetch::BACKWARD_PRE) prefetch_backward();
}

void FsdpUnit::Impl::on_input_gradient(CallBackward& call) {
  if (!call.started || call.done) return;
  call.done = true;
  calls_in_backward = std::max<int64_t>(0, calls_in_backward - 1);  // (0: started before the counts were reset)
  ++calls_done;
  // [Note: frozen parameters]: the call's backward is over, and with it every read of the frozen parameters.
  const bool frozen = accumulating < params.size();
  if (frozen && training == TrainingState::PRE_BACKWARD && gradients_ready == accumulating && calls_in_backward == 0) {
    reduce_scatter_gradients();
    return;
  }
  // [Note: a unit called twice]: between two calls' backwards, with no gradient complete (one that is would be
  // lost to the shards' .grad put back) and another call's backward still to come.
  const bool between_calls = training == TrainingState::PRE_BACKWARD && state == ShardState::UNSHARDED &&
                             gradients_ready == 0 && calls_in_backward == 0 && calls_done < calls;
  if (!between_calls || shards_are_full() || stays_unsharded_after_backward()) return;
  RECORD_USER_SCOPE("FSDP::reshard_between_calls");
  reshard();
  ++schedule->stats.reshards_between_calls;
  if (options.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_backward();
}

void FsdpUnit::Impl::on_parameter_gradient(size_t index) {
  if (state != ShardState::UNSHARDED || training != TrainingState::PRE_BACKWARD) {
    throw std::logic_error("fully_shard(" + module_name + "): parameter '" + params[index].name() +
                           "' received a gradient while its unit was " + state_name(state) + "/" +
                           training_state_name(training) + " (expected UNSHARDED/PRE_BACKWARD): the unit's output "
                           "was not on the path of this backward");
  }
  // One accumulator per parameter that requires a gradient: when all have run, the unit's gradients are complete.
  // [Note: frozen parameters] A unit that also holds parameters without a gradient (a LoRA layer's base weights)
  // cannot reduce and reshard then: its backward may still read them (the input's gradient through a frozen
  // weight comes after the adapters' gradients). It waits for its call's end (on_input_gradient), or for the end
  // of backward when its inputs need no gradient.
  if (++gradients_ready == accumulating && accumulating == params.size()) reduce_scatter_gradients();
}

void FsdpUnit::Impl::reduce_scatter_gradients() {
  RECORD_USER_SCOPE("FSDP::post_backward");
  if (params.empty()) {  // a unit that only groups others (a root without parameters of its own)
    reshard();
    return after_reduce_scatter(TrainingState::IDLE);
  }
  // This backward's full gradients, plus those kept by earlier passes without sync.
  std::vector<at::Tensor> full(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& grad = params[i].grad();
    full[i] = std::move(grad);
    grad = at::Tensor();  // the full gradient does not stay on the parameter
    if (unreduced_grads[i].defined()) {
      if (full[i].defined()) unreduced_grads[i].add_(full[i]);
      full[i] = std::move(unreduced_grads[i]);
      unreduced_grads[i] = at::Tensor();
    }
  }
  const at::ScalarType dtype = reduce_dtype();
  if (!requires_gradient_sync) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (full[i].defined()) unreduced_grads[i] = full[i].to(dtype, /*non_blocking=*/false, /*copy=*/true);
    }
    if (!stays_unsharded_after_backward()) reshard();
    return after_reduce_scatter(TrainingState::IDLE);
  }
  // Memory: what this unit holds from here on is its full gradients and the reduction input, so the full
  // parameters go first (reshard), the previous unit's reduce-scatter is waited for before this one's input is
  // allocated (its backward overlapped that reduction already, when overlapping), and each full gradient is
  // dropped once copied: while copying, the prefetched unit, this unit's gradients and its reduction input are
  // alive, nothing else.
  reshard();
  if (auto previous = schedule->reducing.lock()) {
    if (previous->reduction_in_flight()) ++schedule->stats.overlapped_reduce_scatters;
    previous->wait_reduce_scatter();
  }
  if (shards_are_full() && !has_replicas()) {
    // Nothing to reduce (one rank, no replicas): the full gradients are the sharded ones, installed as they are —
    // no flat buffer, no copy in or out.
    local_grads.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      // Rounded as a reduction would, contiguous and in the (resharded) parameter's shape as a reduction's output
      // is: fused optimizers take the gradient's sizes and strides to be the parameter's, and a 0-dim parameter's
      // shard is (1). Reshaped as a copy, not a view: zero_grad detaches gradients in place.
      if (!full[i].defined()) continue;
      at::Tensor g = full[i].to(dtype).to(own_dtype).contiguous();
      const at::IntArrayRef shard_shape = params[i].param().sizes();
      local_grads[i] = g.sizes() == shard_shape ? std::move(g) : g.reshape(shard_shape).clone();
    }
    return after_reduce_scatter(TrainingState::POST_BACKWARD);
  }
  // Gradients missing at the end of backward (parameters that did not take part here) count as zero in the
  // reduction, or on Gloo are left out where no rank has one; install_gradients leaves grad undefined where no
  // rank had one. Frozen parameters take no part at all, and a unit of frozen parameters reduces nothing.
  if (std::none_of(params.begin(), params.end(), [](const FsdpParam& p) { return p.param().requires_grad(); })) {
    return after_reduce_scatter(TrainingState::IDLE);
  }
  const at::Tensor agreed = agree_on_gradients(full);
  if (agreed.defined() && agreed.max().item<float>() == 0.0f) return after_reduce_scatter(TrainingState::IDLE);
  reduction = foreach_reduce_scatter(full, params, dtype, compute_device, reduction_op(), group, agreed);
  schedule->reducing = weak_from_this();
  ++schedule->stats.reduce_scatters;
  schedule->stats.reduce_scatter_input_bytes += group.size() * static_cast<int64_t>(reduction->output.nbytes());
  schedule->stats.peak_reductions_in_flight =
      std::max(schedule->stats.peak_reductions_in_flight, ++schedule->reductions_in_flight);
  after_reduce_scatter(TrainingState::POST_BACKWARD);
  if (!overlaps_reduce_scatter()) wait_reduce_scatter();
}

at::Tensor FsdpUnit::Impl::agree_on_gradients(const std::vector<at::Tensor>& full) const {
  // On Gloo the ranks first agree which parameters any of them has a gradient for (MAX of a flag per parameter,
  // a few bytes), and the reduction leaves out the others, as FSDP2's leaves out parameters without a gradient:
  // a FLAVA text-only step otherwise reduced every image head of the root as zeros, most of a W=2 backward. On
  // NCCL the flags travel after the reduction (install_gradients): reading them first would wait for the GPU.
  const bool gloo = group.backend() == dist::CommBackend::GLOO &&
                    (!has_replicas() || options.replicate_group->backend() == dist::CommBackend::GLOO);
  if (!gloo) return {};
  RECORD_USER_SCOPE("FSDP::agree_on_gradients");
  std::vector<float> local(params.size(), 0.0f);
  for (size_t i = 0; i < params.size(); ++i) local[i] = full[i].defined() ? 1.0f : 0.0f;
  at::Tensor flags = at::tensor(local);
  max_over_ranks(flags);
  return flags;
}

void FsdpUnit::Impl::max_over_ranks(at::Tensor& flags) const {
  if (!shards_are_full()) group.all_reduce(flags, dist::ReduceOp::MAX).wait();
  if (has_replicas()) options.replicate_group->all_reduce(flags, dist::ReduceOp::MAX).wait();
}

void FsdpUnit::Impl::after_reduce_scatter(TrainingState next) {
  set_training(next);
  if (options.backward_prefetch == BackwardPrefetch::BACKWARD_POST) prefetch_backward();
}

void FsdpUnit::Impl::finish_reduction() {
  if (training == TrainingState::PRE_BACKWARD) reduce_scatter_gradients();
  wait_reduce_scatter();
}

bool FsdpUnit::Impl::reduction_in_flight() const {
  return training == TrainingState::POST_BACKWARD && reduction && reduction->work;
}

void FsdpUnit::Impl::wait_reduce_scatter() {
  if (!reduction_in_flight()) return;
  RECORD_USER_SCOPE("FSDP::wait_reduce_scatter");
  reduction->work->wait();  // releases the reduce-scatter's full-size input
  reduction->work.reset();
  --schedule->reductions_in_flight;
  if (has_replicas()) {
    // Hybrid sharding / NO_SHARD: the shards of the same rows, one per replica, reduced across replicas (in the
    // reduce dtype, on the compute device; install_gradients converts).
    replicate_work = options.replicate_group->all_reduce(reduction->output, reduction_op());
    return;
  }
  // The reduced shards take the parameters' dtype and device now, not at the end of backward (FSDP2 casts right
  // after its reduce-scatter too): held until then, every unit's output in the reduce dtype would sit beside the
  // gradients installed from it — with bf16 reductions of float32 parameters 2 bytes per parameter / W more at the
  // end of backward — and, offloaded, every unit's gradient shard would stay on the compute device.
  move_reduced_home();
}

void FsdpUnit::Impl::move_reduced_home() {
  at::Tensor& output = reduction->output;
  if (offloaded()) {
    const memory::CpuTierScope host(memory::CpuTier::HOST);
    output = output.to(at::kCPU, own_dtype, /*non_blocking=*/false, /*copy=*/true);
  } else if (output.scalar_type() != own_dtype) {
    output = output.to(own_dtype);
  }
}

void FsdpUnit::Impl::install_gradients() {
  if (training != TrainingState::POST_BACKWARD) return;
  RECORD_USER_SCOPE("FSDP::install_gradients");
  c10::AutoGradMode no_grad(false);
  if (!local_grads.empty()) {  // a group of one (reduce_scatter_gradients)
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = std::move(local_grads[i]);
      if (!g.defined() || !params[i].param().requires_grad()) continue;
      if (options.gradient_divide_factor) g.div_(*options.gradient_divide_factor);
      accumulate_grad(params[i].grad(), std::move(g));
    }
    local_grads.clear();
    return set_training(TrainingState::IDLE);
  }
  replicate_work.wait();
  replicate_work = dist::Work();
  if (has_replicas() && offloaded()) move_reduced_home();  // reduced across replicas on the compute device
  // Offloaded, the gradients join their shards in host memory: what is allocated here is the host's.
  const memory::CpuTierScope tier(offloaded() ? memory::CpuTier::HOST : memory::CpuTier::COMPUTE);
  at::Tensor& output = reduction->output;
  if (options.gradient_divide_factor) output.div_(*options.gradient_divide_factor);
  // Which parameters got a gradient on any rank: those keep (or get) one; the others stay undefined. Zero
  // gradients are not the same as none — AdamW would still decay and move such parameters.
  at::Tensor& has_gradient = reduction->has_gradient;
  if (!reduction->has_gradient_agreed) max_over_ranks(has_gradient);
  const at::Tensor flags = has_gradient.to(at::kCPU);
  const float* took_part = flags.data_ptr<float>();
  // Gradients share the output's memory only when every parameter reduced into it gets one: else the rows of the
  // others (FLAVA's image heads on a text-only step, on NCCL; Gloo leaves them out) would stay allocated with them.
  bool all_installed = true;
  for (size_t i = 0; i < params.size(); ++i) all_installed &= reduction->offsets[i] < 0 || took_part[i] != 0.0f;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t offset = reduction->offsets[i];
    if (offset < 0 || took_part[i] == 0.0f) continue;  // frozen (not reduced), or no rank had a gradient
    at::Tensor reduced = params[i].as_shard(output.narrow(0, offset, params[i].shard_numel()));
    const bool own_memory = !reduced.is_alias_of(output);
    at::Tensor& grad = params[i].grad();
    if (grad.defined()) {
      grad.add_(reduced);
    } else if (reduced.scalar_type() == own_dtype && (all_installed || own_memory)) {
      // The reduction's own memory, not a copy (FSDP2's gradients are views of its reduce-scatter output too): a
      // tensor of its own over that storage rather than an autograd view, which zero_grad(set_to_none=false)
      // could not detach in place. A copy held the largest unit's shard twice at the end of backward.
      at::Tensor alias = at::empty({0}, reduced.options());
      alias.set_(reduced.storage(), reduced.storage_offset(), reduced.sizes(), reduced.strides());
      grad = std::move(alias);
    } else {
      grad = reduced.to(own_dtype, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  reduction.reset();
  set_training(TrainingState::IDLE);
}

nn::TensorVec FsdpInterceptor::around(torch::nn::Module& /*module*/, nn::TensorVec inputs, const Next& next) {
  FsdpUnit::Impl& u = *unit_;
  RootState& schedule = *u.schedule;
  if (u.training == TrainingState::PRE_BACKWARD || u.training == TrainingState::POST_BACKWARD) {
    throw std::logic_error("fully_shard(" + u.module_name + "): forward called while the unit is in " +
                           training_state_name(u.training) + "; finish the backward pass first");
  }
  // Backward prefetches in the reverse of this forward's own post-forward order (FSDP2 keeps one per iteration
  // too): models that run different units per step (FLAVA's text-only and image-only steps) would otherwise
  // gather, in backward, a layer that did not run.
  if (schedule.root == &u) {
    schedule.post_forward_order.clear();
    ++schedule.forwards;
    schedule.forward_order = std::move(schedule.running_forward_order);
    schedule.running_forward_order.clear();
    schedule.drop_unused_prefetches();  // after a forward without backward (evaluation)
  }
  const int64_t occurrence = RootState::calls_of(schedule.running_forward_order, &u);  // this call is the unit's
  schedule.record_call(schedule.running_forward_order, unit_);
  u.unshard();
  u.set_training(TrainingState::FORWARD);
  if (u.options.forward_prefetch > 0) u.prefetch_forward(occurrence);
  // This call's backward, as the hooks on its outputs and the node on its inputs see it.
  // (A unit without parameters has nothing to reshard: its calls are not counted.)
  std::shared_ptr<CallBackward> call;
  if (at::GradMode::is_enabled()) call = std::make_shared<CallBackward>();
  if (call && !u.params.empty()) {
    ++u.calls;
    std::vector<at::Tensor*> tracked;
    for (auto& in : inputs) {
      if (in.defined() && in.requires_grad()) tracked.push_back(&in);
    }
    if (!tracked.empty()) {
      auto node = std::shared_ptr<CallEndNode>(new CallEndNode(unit_, call), torch::autograd::deleteNode);
      torch::autograd::variable_list sources;
      for (at::Tensor* in : tracked) sources.push_back(*in);
      node->set_next_edges(torch::autograd::collect_next_edges(sources));
      for (at::Tensor* in : tracked) {
        *in = in->detach();  // the same values and version counter, its gradient through the node
        torch::autograd::create_gradient_edge(*in, node);
      }
    }
  }
  const MixedPrecision& mp = u.options.mixed_precision;
  if (mp.cast_forward_inputs) {
    for (auto& in : inputs) in = cast_if_floating(in, mp.param_dtype);
  }
  nn::TensorVec outputs = next(std::move(inputs));
  // A unit whose forward ran without grad mode (FLAVA's frozen codebook) has no backward: gathering it there
  // would only hold it until the end of backward.
  if (call) {
    call->post_forward_index = schedule.record_call(schedule.post_forward_order, unit_);
    call->forward = schedule.forwards;
  }
  // Without grad mode no backward follows to reshard the unit, so it reshards now whatever the strategy (the
  // optimizer must never see full parameters). The root stays gathered for the backward that starts right after
  // its forward, as in FSDP2: resharding it would only gather it again at once, holding the gathered buffer and
  // the full parameters together while every activation is alive (FLAVA's root, frozen codebook included, is
  // 3/4 of the model) — unless sharded gradients wait aside (stashed_grads): a zero_grad() between this forward
  // and the backward, a common order, reaches them only when the parameters are sharded again.
  const bool backward_follows = at::GradMode::is_enabled();
  const bool keep_root = schedule.root == &u && std::none_of(u.stashed_grads.begin(), u.stashed_grads.end(),
                                                             [](const at::Tensor& g) { return g.defined(); });
  if (!backward_follows || (u.options.reshard_after_forward && !keep_root)) u.reshard();
  u.set_training(TrainingState::IDLE);
  for (auto& out : outputs) out = cast_if_floating(out, mp.output_dtype);
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<FsdpUnit::Impl> weak = unit_;
    for (auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      out.register_hook([weak, call](const at::Tensor&) {
        if (auto locked = weak.lock()) locked->on_output_gradient(*call);
      });
    }
  }
  return outputs;
}

// ---- FsdpUnit handle ----

ShardState FsdpUnit::state() const { return impl_->state; }
const std::string& FsdpUnit::module_name() const { return impl_->module_name; }
std::vector<std::string> FsdpUnit::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& p : impl_->params) names.push_back(p.name());
  return names;
}
int64_t FsdpUnit::sharded_numel() const { return impl_->unit_shard_numel; }
int64_t FsdpUnit::full_numel() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.full_numel();
  return n;
}
void FsdpUnit::unshard() { impl_->unshard(); }
void FsdpUnit::reshard() {
  impl_->discard_gather();
  impl_->reshard();
}
void FsdpUnit::set_requires_gradient_sync(bool sync) { impl_->requires_gradient_sync = sync; }

// Called by fully_shard once the Impl is owned by a shared_ptr (hooks hold weak references to it).
void install_unit(const std::shared_ptr<FsdpUnit::Impl>& unit) {
  c10::AutoGradMode no_grad(false);
  const at::ScalarType compute = unit->compute_dtype();
  std::vector<at::Tensor> full_values;
  std::weak_ptr<FsdpUnit::Impl> weak = unit;
  unit->grad_accumulators.resize(unit->params.size());
  for (size_t i = 0; i < unit->params.size(); ++i) {
    const at::Tensor& p = unit->params[i].param();
    full_values.push_back(p.detach());  // keeps the full value's storage while p's data is swapped below
    if (!p.requires_grad()) continue;
    // The accumulator is taken while the parameter has its full shape and compute dtype: an AccumulateGrad node
    // records both when created, and autograd checks (and casts) incoming gradients against them.
    if (compute != p.scalar_type()) p.set_data(at::empty(p.sizes(), p.options().dtype(compute)));
    auto accumulator = torch::autograd::impl::grad_accumulator(p);
    accumulator->add_post_hook(std::make_unique<nn::AfterAccumulate>([weak, i] {
      if (auto u = weak.lock()) u->on_parameter_gradient(i);
    }));
    unit->grad_accumulators[i] = std::move(accumulator);
    ++unit->accumulating;
  }
  if (!unit->params.empty()) {
    const at::Tensor& first = full_values.front();
    auto options = first.options().requires_grad(false);
    if (unit->offloaded()) options = options.device(at::kCPU).pinned_memory(unit->compute_device.is_cuda());
    {
      const memory::CpuTierScope tier(unit->offloaded() ? memory::CpuTier::HOST : memory::CpuTier::COMPUTE);
      unit->sharded_flat = at::empty({unit->unit_shard_numel}, options);
    }
    for (size_t i = 0; i < unit->params.size(); ++i) {
      unit->params[i].init_shard(unit->sharded_flat.narrow(0, unit->offsets[i], unit->params[i].shard_numel()),
                                 full_values[i]);
    }
  }
}

}  // namespace shardtrain::fsdp
