#include "shardtrain/fsdp/fully_shard.h"

#include <torch/nn/module.h>

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "fsdp/fsdp_unit.h"
#include "shardtrain/fsdp/state_dict.h"

namespace shardtrain::fsdp {

void install_unit(const std::shared_ptr<FsdpUnit::Impl>& unit);  // fsdp_unit.cpp

FsdpInterceptor* fsdp_interceptor_of(torch::nn::Module& module) { return nn::interceptor_of<FsdpInterceptor>(module); }

// The units inside `root` (itself included), in named_modules() order.
std::vector<std::shared_ptr<FsdpUnit::Impl>> unit_impls_of(const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<std::shared_ptr<FsdpUnit::Impl>> units;
  for (const auto& item : root->named_modules()) {
    if (FsdpInterceptor* f = fsdp_interceptor_of(*item.value())) units.push_back(f->unit());
  }
  return units;
}

FsdpUnit fully_shard(const std::shared_ptr<torch::nn::Module>& module, const dist::Communicator& group,
                     const FsdpOptions& options) {
  if (!module) throw std::invalid_argument("fully_shard: null module");
  nn::InterceptPoint* point = nn::as_intercept_point(*module);
  if (point == nullptr) {
    throw std::invalid_argument("fully_shard: module " + module->name() +
                                " does not derive from shardtrain::nn::Interceptable, so its calls cannot be "
                                "intercepted (see shardtrain/nn/intercept.h)");
  }
  if (fsdp_interceptor_of(*module) != nullptr) {
    throw std::invalid_argument("fully_shard: module " + module->name() + " is already a unit");
  }
  // Parameters and buffers of units inside this module belong to them; so do their schedules, which this unit's
  // schedule takes over (this unit becomes their root).
  std::set<const c10::TensorImpl*> owned;
  std::set<const c10::TensorImpl*> inner_buffers;
  auto schedule = std::make_shared<RootState>();
  for (const auto& item : module->named_modules("", /*include_self=*/false)) {
    if (FsdpInterceptor* inner = fsdp_interceptor_of(*item.value())) {
      for (const auto& p : inner->unit()->params) owned.insert(p.param().unsafeGetTensorImpl());
      for (const auto& b : item.value()->buffers()) inner_buffers.insert(b.unsafeGetTensorImpl());
      inner->unit()->schedule = schedule;
      schedule->units.push_back(inner->unit());
    }
  }
  // Float8 all-gather: the modules whose float8 product reads a weight, by that weight.
  std::map<const c10::TensorImpl*, std::shared_ptr<torch::nn::Module>> float8_readers;
  if (options.float8_all_gather) {
    for (const auto& m : module->modules(/*include_self=*/true)) {
      auto* cast = dynamic_cast<nn::Float8CastAhead*>(m.get());
      if (cast && cast->float8_weight().defined()) float8_readers[cast->float8_weight().unsafeGetTensorImpl()] = m;
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<std::shared_ptr<torch::nn::Module>> float8;
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
    if (owned.count(impl) != 0) continue;
    params.emplace_back(item.key(), item.value());
    const auto reader = float8_readers.find(impl);
    float8.push_back(reader == float8_readers.end() ? nullptr : reader->second);
  }
  auto unit = std::make_shared<FsdpUnit::Impl>(module->name(), std::move(params), group, options, float8);
  unit->schedule = schedule;
  schedule->units.push_back(unit);
  schedule->root = unit.get();
  install_unit(unit);
  if (const auto& buffer_dtype = options.mixed_precision.buffer_dtype) {
    c10::AutoGradMode no_grad(false);
    for (auto& b : module->buffers()) {
      if (inner_buffers.count(b.unsafeGetTensorImpl()) == 0 && b.is_floating_point()) b.set_data(b.to(*buffer_dtype));
    }
  }
  point->interceptors().add(std::make_shared<FsdpInterceptor>(unit));
  return FsdpUnit(unit);
}

bool reshards_after_forward(parallel::Strategy strategy) {
  return strategy == parallel::Strategy::FULL_SHARD || strategy == parallel::Strategy::HYBRID_SHARD;
}

bool overlaps_reduce_scatter_by_default(dist::CommBackend backend) { return backend == dist::CommBackend::NCCL; }

StrategyGroups strategy_groups(parallel::Strategy strategy, const dist::DeviceMesh& mesh) {
  FsdpOptions options;
  options.reshard_after_forward = reshards_after_forward(strategy);
  switch (strategy) {
    case parallel::Strategy::FULL_SHARD:
    case parallel::Strategy::SHARD_GRAD_OP:
      return {mesh.data_group(), options};
    case parallel::Strategy::NO_SHARD:  // a shard group of one: each rank's shard is the whole parameter
      options.replicate_group = mesh.data_group();
      return {dist::Communicator::single(mesh.world().global_ranks()[mesh.world().rank()]), options};
    case parallel::Strategy::HYBRID_SHARD:
    case parallel::Strategy::HYBRID_SHARD_ZERO2:
      options.replicate_group = mesh.replicate_group();
      return {mesh.shard_group(), options};
    case parallel::Strategy::DDP:
      break;
  }
  throw std::invalid_argument("strategy_groups: " + parallel::to_string(strategy) + " is not one of FSDP's (DDP "
                              "replicates the model: ddp::replicate)");
}

std::vector<FsdpUnit> units_of(const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<FsdpUnit> units;
  for (auto& impl : unit_impls_of(root)) units.emplace_back(std::move(impl));
  return units;
}

std::vector<std::shared_ptr<FsdpUnit::Impl>> units_sharing_one_group(const std::shared_ptr<torch::nn::Module>& root,
                                                                    const char* caller) {
  std::vector<std::shared_ptr<FsdpUnit::Impl>> units = unit_impls_of(root);
  if (units.empty()) throw std::invalid_argument(std::string(caller) + ": " + root->name() + " contains no fully_shard unit");
  const dist::Communicator& group = units.front()->group;
  for (const auto& unit : units) {
    if (unit->group.global_ranks() != group.global_ranks()) {
      throw std::invalid_argument(std::string(caller) + ": unit " + unit->module_name + " shards over " +
                                  unit->group.name() + ", another over " + group.name() + "; one shard group is required");
    }
  }
  return units;
}

optim::RowSharding row_sharding(const std::shared_ptr<torch::nn::Module>& root) {
  optim::RowSharding sharding{units_sharing_one_group(root, "row_sharding").front()->group, {}};
  for (const RowSlot& slot : row_slots(root)) {
    sharding.params[slot.tensor.unsafeGetTensorImpl()] = {slot.full_shape.empty() ? 1 : slot.full_shape[0], slot.rows};
  }
  return sharding;
}

double clip_grad_norm(const std::shared_ptr<torch::nn::Module>& root, double max_norm,
                      const dist::Communicator* stages) {
  const std::vector<std::shared_ptr<FsdpUnit::Impl>> units = units_sharing_one_group(root, "clip_grad_norm");
  const dist::Communicator& group = units.front()->group;
  // Sum of squares in float64 over this rank's shards. Padding rows hold zero gradient and add nothing; shards are
  // disjoint within the shard group, and replicas (hybrid, NO_SHARD) hold identical averaged shards, so the sum
  // over the shard group alone is the whole model's.
  // Summed where the gradients are (the CPU when offloaded), reduced on the group's device.
  at::Tensor sum_sq;
  for (const auto& unit : units) {
    for (const auto& p : unit->params) {
      const at::Tensor& g = p.param().grad();
      if (!g.defined()) continue;
      at::Tensor s = g.to(at::kDouble).pow(2).sum();
      sum_sq = sum_sq.defined() ? sum_sq + s : s;
    }
  }
  sum_sq = (sum_sq.defined() ? sum_sq.reshape({1}) : at::zeros({1}, at::kDouble)).to(group.device());
  group.all_reduce(sum_sq, dist::ReduceOp::SUM).wait();
  if (stages != nullptr && stages->size() > 1) stages->all_reduce(sum_sq, dist::ReduceOp::SUM).wait();
  const double norm = std::sqrt(sum_sq.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    c10::AutoGradMode no_grad(false);
    for (const auto& unit : units) {
      for (auto& p : unit->params) {
        if (p.param().grad().defined()) p.grad().mul_(coefficient);
      }
    }
  }
  return norm;
}

std::map<std::string, at::Tensor> gather_full_parameters(const std::shared_ptr<torch::nn::Module>& root) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& named : root->named_parameters()) names[named.value().unsafeGetTensorImpl()] = named.key();
  std::map<std::string, at::Tensor> full;
  for (const auto& unit : unit_impls_of(root)) {
    std::vector<at::Tensor> values = unit->gather_full_values();
    for (size_t i = 0; i < values.size(); ++i) {
      auto it = names.find(unit->params[i].param().unsafeGetTensorImpl());
      full[it->second] = std::move(values[i]);
      names.erase(it);
    }
  }
  for (const auto& named : root->named_parameters()) {  // parameters no unit owns
    if (names.count(named.value().unsafeGetTensorImpl())) full[named.key()] = named.value().detach().clone();
  }
  return full;
}

void set_requires_gradient_sync(const std::shared_ptr<torch::nn::Module>& root, bool sync) {
  for (auto& unit : unit_impls_of(root)) unit->requires_gradient_sync = sync;
}

void set_reshard_after_backward(const std::shared_ptr<torch::nn::Module>& root, bool reshard) {
  for (auto& unit : unit_impls_of(root)) unit->reshard_after_backward = reshard;
}

NoSync::NoSync(std::shared_ptr<torch::nn::Module> root) : root_(std::move(root)) {
  set_requires_gradient_sync(root_, false);
}
NoSync::~NoSync() { set_requires_gradient_sync(root_, true); }

namespace {
RootState& schedule_of(const std::shared_ptr<torch::nn::Module>& root) {
  FsdpInterceptor* f = fsdp_interceptor_of(*root);
  if (f == nullptr) throw std::invalid_argument("fsdp_stats: module " + root->name() + " is not a fully_shard unit");
  return *f->unit()->schedule;
}
}  // namespace

FsdpStats fsdp_stats(const std::shared_ptr<torch::nn::Module>& root) { return schedule_of(root).stats; }

void reset_fsdp_stats(const std::shared_ptr<torch::nn::Module>& root) {
  RootState& s = schedule_of(root);
  s.stats = FsdpStats{};
  s.stats.peak_unsharded_units = s.unsharded_units;
  s.stats.peak_unsharded_bytes = s.unsharded_bytes;
}

}  // namespace shardtrain::fsdp
