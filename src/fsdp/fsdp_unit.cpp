#include "fsdp/fsdp_unit.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

namespace shardtrain::fsdp {
namespace {

// Runs a callback after an AccumulateGrad node filled its parameter's .grad (../shared/notes/libtorch.md §2).
struct AfterAccumulate : torch::autograd::FunctionPostHook {
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }
  std::function<void()> fn_;
};

const char* state_name(ShardState s) { return s == ShardState::SHARDED ? "SHARDED" : "UNSHARDED"; }

const char* training_name(TrainingState s) {
  switch (s) {
    case TrainingState::IDLE: return "IDLE";
    case TrainingState::FORWARD: return "FORWARD";
    case TrainingState::PRE_BACKWARD: return "PRE_BACKWARD";
    case TrainingState::POST_BACKWARD: return "POST_BACKWARD";
  }
  return "?";
}

}  // namespace

FsdpUnit::Impl::Impl(std::string name, std::vector<std::pair<std::string, at::Tensor>> named_params,
                     dist::Communicator comm, FsdpOptions opts)
    : module_name(std::move(name)), group(std::move(comm)), options(opts) {
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
    params.emplace_back(param_name, tensor, group.size(), group.rank());
    unit_shard_numel += params.back().shard_numel();
  }
  stashed_grads.resize(params.size());
}

void FsdpUnit::Impl::unshard() {
  if (state == ShardState::UNSHARDED) return;
  // The sharded gradients wait aside while the parameters hold their full values (AccumulateGrad then starts
  // from an empty .grad of the full shape).
  for (size_t i = 0; i < params.size(); ++i) {
    stashed_grads[i] = params[i].param().grad();
    params[i].grad() = at::Tensor();
  }
  if (!params.empty()) {
    at::Tensor gathered = at::empty({group.size() * unit_shard_numel}, sharded_flat.options());
    group.all_gather(gathered, sharded_flat).wait();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].alloc_unsharded();
      params[i].copy_in_unsharded(gathered, unit_shard_numel, offsets[i]);
      params[i].use_unsharded();
    }
  }
  state = ShardState::UNSHARDED;
}

void FsdpUnit::Impl::reshard() {
  if (state == ShardState::SHARDED) return;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].use_sharded();
    params[i].grad() = std::move(stashed_grads[i]);
    stashed_grads[i] = at::Tensor();
  }
  state = ShardState::SHARDED;
}

void FsdpUnit::Impl::on_output_gradient() {
  if (!backward_callback_queued) {
    std::weak_ptr<Impl> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto unit = weak.lock()) unit->finish_backward();
    });
    backward_callback_queued = true;
  }
  if (training == TrainingState::PRE_BACKWARD || training == TrainingState::POST_BACKWARD) return;
  unshard();
  training = TrainingState::PRE_BACKWARD;
  gradients_ready = 0;
}

void FsdpUnit::Impl::on_parameter_gradient(size_t index) {
  if (state != ShardState::UNSHARDED || training != TrainingState::PRE_BACKWARD) {
    throw std::logic_error("fully_shard(" + module_name + "): parameter '" + params[index].name() +
                           "' received a gradient while its unit was " + state_name(state) + "/" +
                           training_name(training) + " (expected UNSHARDED/PRE_BACKWARD): the unit's output was "
                           "not on the path of this backward");
  }
  // One accumulator per parameter that requires a gradient: when all have run, the unit's gradients are complete.
  if (++gradients_ready == grad_accumulators.size()) reduce_scatter_gradients();
}

void FsdpUnit::Impl::reduce_scatter_gradients() {
  if (params.empty()) {  // a unit that only groups others (a root without parameters of its own)
    reshard();
    training = TrainingState::IDLE;
    return;
  }
  // Gradients missing at the end of backward (parameters that did not take part) count as zero, as in FSDP.
  at::Tensor rs_input = at::zeros({group.size() * unit_shard_numel}, sharded_flat.options());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& grad = params[i].grad();
    if (grad.defined()) params[i].copy_grad_out(grad, rs_input, unit_shard_numel, offsets[i]);
    grad = at::Tensor();  // the full gradient is not kept
  }
  rs_output = at::empty({unit_shard_numel}, sharded_flat.options());
  rs_work = group.reduce_scatter(rs_output, rs_input, dist::ReduceOp::MEAN);
  reshard();
  training = TrainingState::POST_BACKWARD;
}

void FsdpUnit::Impl::finish_backward() {
  backward_callback_queued = false;
  if (training == TrainingState::PRE_BACKWARD) reduce_scatter_gradients();
  if (training != TrainingState::POST_BACKWARD) return;
  rs_work.wait();
  if (options.replicate_group && options.replicate_group->size() > 1) {
    // Hybrid sharding / NO_SHARD: the shards of the same rows, one per replica, averaged across replicas.
    options.replicate_group->all_reduce(rs_output, dist::ReduceOp::MEAN).wait();
  }
  c10::AutoGradMode no_grad(false);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].param().requires_grad()) continue;
    at::Tensor reduced = params[i].as_shard(rs_output.narrow(0, offsets[i], params[i].shard_numel()));
    at::Tensor& grad = params[i].grad();
    if (grad.defined()) {
      grad.add_(reduced);  // accumulation across backward passes, as .grad does
    } else {
      // A tensor of its own, not a view of rs_output: optimizers' zero_grad() detaches gradients in place, which
      // views do not allow.
      grad = reduced.clone();
    }
  }
  rs_output = at::Tensor();
  rs_work = dist::Work();
  training = TrainingState::IDLE;
}

nn::TensorVec FsdpInterceptor::around(torch::nn::Module& /*module*/, nn::TensorVec inputs, const Next& next) {
  FsdpUnit::Impl& u = *unit_;
  if (u.training == TrainingState::PRE_BACKWARD || u.training == TrainingState::POST_BACKWARD) {
    throw std::logic_error("fully_shard(" + u.module_name + "): forward called while the unit is in " +
                           training_name(u.training) + "; finish the backward pass first");
  }
  u.unshard();
  u.training = TrainingState::FORWARD;
  nn::TensorVec outputs = next(std::move(inputs));
  if (u.options.reshard_after_forward) u.reshard();
  u.training = TrainingState::IDLE;
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<FsdpUnit::Impl> weak = unit_;
    for (auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      out.register_hook([weak](const at::Tensor&) {
        if (auto locked = weak.lock()) locked->on_output_gradient();
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
void FsdpUnit::reshard() { impl_->reshard(); }

// Called by fully_shard once the Impl is owned by a shared_ptr (hooks hold weak references to it).
void install_unit(const std::shared_ptr<FsdpUnit::Impl>& unit) {
  // The accumulators are taken while the parameters still have their full shape: an AccumulateGrad node records
  // its parameter's shape when created, and autograd checks incoming gradients against it.
  std::weak_ptr<FsdpUnit::Impl> weak = unit;
  for (size_t i = 0; i < unit->params.size(); ++i) {
    const at::Tensor& p = unit->params[i].param();
    if (!p.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p);
    accumulator->add_post_hook(std::make_unique<AfterAccumulate>([weak, i] {
      if (auto u = weak.lock()) u->on_parameter_gradient(i);
    }));
    unit->grad_accumulators.push_back(std::move(accumulator));
  }
  if (!unit->params.empty()) {
    unit->sharded_flat = at::empty({unit->unit_shard_numel}, unit->params.front().param().options().requires_grad(false));
    for (size_t i = 0; i < unit->params.size(); ++i) {
      unit->params[i].init_shard(unit->sharded_flat.narrow(0, unit->offsets[i], unit->params[i].shard_numel()));
    }
  }
}

}  // namespace shardtrain::fsdp
