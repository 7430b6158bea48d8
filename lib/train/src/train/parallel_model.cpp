#include "train/parallel_model.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/nn/autocast.h"
#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::train {
namespace {

using config::Config;

fsdp::BackwardPrefetch backward_prefetch_of(config::Prefetch p) {
  switch (p) {
    case config::Prefetch::BACKWARD_PRE: return fsdp::BackwardPrefetch::BACKWARD_PRE;
    case config::Prefetch::BACKWARD_POST: return fsdp::BackwardPrefetch::BACKWARD_POST;
    case config::Prefetch::NONE: break;
  }
  return fsdp::BackwardPrefetch::NONE;
}

// How init_weights loads: partially when model.overrides resized the model it was saved from (what the file shares
// with it, as transformers' from_pretrained with a changed config; the report names the rest), and with
// model.ignore_mismatched_sizes as transformers' flag of that name.
models::LoadOptions load_options(const Config& c) {
  models::LoadOptions o;
  o.partial = !c.model.overrides.empty();
  o.ignore_mismatched_sizes = c.model.ignore_mismatched_sizes;
  return o;
}

// model.lora.from: the adapter PEFT wrote, over the base model's weights just loaded.
models::LoadOptions adapter_options() {
  models::LoadOptions o;
  o.lora_adapter = true;
  return o;
}

// DDP: every rank builds the whole model (a pipeline rank its stages); with sync_module_states the first rank of
// each data-parallel group reads init_weights — the first replica's ranks: world rank 0 alone without tensor or
// pipeline parallelism, else each tensor-parallel rank (before it keeps its slices) and each stage — and
// replicate() hands its parameters to the group's others.
models::ZooModel build_replicated(const Config& c, std::shared_ptr<const models::ModelRecipe> recipe,
                                  const models::BuildOptions& build, const dist::DeviceMesh& mesh,
                                  const at::Device& device, models::LoadReport& report) {
  models::ZooModel model = models::build_model(std::move(recipe), build);
  const bool reads = !c.parallel.sync_module_states || mesh.data_group().rank() == 0;
  if (!c.model.init_weights.empty() && reads) {
    report = models::load_weights(*model.module, c.model.init_weights, model.names, load_options(c));
  }
  if (!c.model.lora.from.empty() && reads) {
    models::load_weights(*model.module, models::lora_adapter_file(c.model.lora.from), model.names, adapter_options());
  }
  if (c.parallel.activation_checkpointing) {
    models::activation_checkpoint_layers(model, c.parallel.activation_checkpointing_every, c.parallel.layer_classes);
  }
  if (c.parallel.activation_offload) models::activation_offload_layers(model, c.parallel.layer_classes);
  // Mixed precision without sharding: autocast around the model (parameters, gradients, optimizer float32).
  if (c.parallel.mixed_precision != parallel::Precision::NO) {
    nn::autocast_module(*model.module, device.type(),
                        c.parallel.mixed_precision == parallel::Precision::BF16 ? at::kBFloat16 : at::kHalf);
  }
  return model;
}

models::ParallelizeOptions parallelize_options(const Config& c) {
  models::ParallelizeOptions o;
  o.strategy = c.parallel.strategy;  // one of FSDP's: ParallelModel replicates a DDP model itself
  if (c.parallel.mixed_precision == parallel::Precision::BF16) {
    o.fsdp.mixed_precision.param_dtype = at::kBFloat16;
    o.fsdp.mixed_precision.reduce_dtype = at::kBFloat16;
  }
  if (c.parallel.mixed_precision == parallel::Precision::FP16) {
    // float16 gradients are scaled (optim::GradScaler in the loop); their sum over ranks is taken in float32, where
    // a scaled gradient cannot overflow.
    o.fsdp.mixed_precision.param_dtype = at::kHalf;
    o.fsdp.mixed_precision.reduce_dtype = at::kFloat;
  }
  o.fsdp.forward_prefetch = static_cast<int>(c.parallel.forward_prefetch);
  o.fsdp.limit_all_gathers = c.parallel.limit_all_gathers;
  o.fsdp.backward_prefetch = backward_prefetch_of(c.parallel.backward_prefetch);
  o.fsdp.offload_params = c.parallel.offload != parallel::Offload::NONE;
  o.fsdp.float8_all_gather = c.train.fp8_all_gather;
  o.activation_offload = c.parallel.activation_offload;
  o.layer_classes = c.parallel.layer_classes;
  o.activation_checkpoint_every =
      c.parallel.activation_checkpointing ? c.parallel.activation_checkpointing_every : 0;
  if (c.parallel.wrap == parallel::Wrap::SIZE) o.policy = fsdp::wrap_by_size(c.parallel.min_params);
  if (c.parallel.wrap == parallel::Wrap::NONE) {
    o.policy = fsdp::wrap_if([](const std::string&, torch::nn::Module&) { return false; });  // the root alone
  }
  return o;
}

// FSDP: the family's layers are sharded as they are built; other units need the whole model first. Weights from a
// file go into the sharded model: each rank reads its rows, or (sync_module_states) rank 0 reads and broadcasts,
// for a file only rank 0 can see. With tensor parallelism (mesh.tp_size() > 1) each layer is split before it is
// sharded (which needs the family's layers as the units), `tp` is set, and the rows read are those of each rank's
// slices.
models::ZooModel build_sharded(const Config& c, std::shared_ptr<const models::ModelRecipe> recipe,
                               const models::BuildOptions& build, const dist::DeviceMesh& mesh,
                               models::LoadReport& report, std::optional<models::TensorParallel>& tp) {
  const models::ParallelizeOptions o = parallelize_options(c);
  const std::string own_layer = recipe->layer_class();
  const bool default_units = !o.policy && (o.layer_classes.empty() ||
                                           (o.layer_classes.size() == 1 && o.layer_classes[0] == own_layer));
  models::ZooModel model;
  if (mesh.tp_size() > 1) {
    if (!default_units) {
      throw std::invalid_argument("parallel.tp_size " + std::to_string(mesh.tp_size()) + " shards the family's "
                                  "transformer layers as they are built: parallel.wrap must be transformer");
    }
    models::TensorParallelModel built = models::build_tensor_parallel(
        std::move(recipe), mesh, o, {c.parallel.sequence_parallel}, build);
    model = std::move(built.model);
    tp = std::move(built.tp);
  } else if (default_units) {
    model = models::build_parallel(std::move(recipe), mesh, o, build);
  } else {
    model = models::build_model(std::move(recipe), build);
    models::parallelize(model, mesh, o);
  }
  // A pipeline stage's ranks load its tensors among themselves: with sync_module_states the stage's first rank reads.
  const dist::Communicator& loaders = mesh.pp_size() > 1 ? mesh.data_group() : mesh.world();
  const std::optional<dist::Communicator> from_rank0 =
      c.parallel.sync_module_states ? std::optional(loaders) : std::nullopt;
  if (!c.model.init_weights.empty()) {
    report = models::load_weights_sharded(model.module, c.model.init_weights, model.names, from_rank0,
                                          load_options(c), tp ? &*tp : nullptr);
  }
  if (!c.model.lora.from.empty()) {
    models::load_weights_sharded(model.module, models::lora_adapter_file(c.model.lora.from), model.names, from_rank0,
                                 adapter_options());
  }
  if (!build.stages.empty()) {  // the other stages' tensors are theirs, not unused
    const models::ZooModel whole = models::build_model(model.recipe, models::meta_build());
    std::set<std::string> held;
    for (const auto& [ours, hf] : models::hf_names_of(*whole.module, whole.names)) held.insert(hf);
    report.unused.erase(std::remove_if(report.unused.begin(), report.unused.end(),
                                       [&](const std::string& name) { return held.count(name) > 0; }),
                        report.unused.end());
  }
  fsdp::set_reshard_after_backward(model.module, c.parallel.reshard_after_backward);
  return model;
}

}  // namespace

at::ScalarType scalar_type_of(config::Dtype d) {
  switch (d) {
    case config::Dtype::FLOAT32: return at::kFloat;
    case config::Dtype::BFLOAT16: return at::kBFloat16;
    case config::Dtype::FLOAT16: return at::kHalf;
  }
  return at::kFloat;
}

ParallelModel::ParallelModel(const Config& c, std::shared_ptr<const models::ModelRecipe> recipe, bool has_unused,
                             const dist::DeviceMesh& mesh, const at::Device& device,
                             std::vector<models::StageLayers> stages)
    : dtype_(scalar_type_of(c.model.dtype)) {
  models::BuildOptions build;
  build.stages = std::move(stages);
  if (mesh.pp_size() > 1) pp_group_ = mesh.pp_group();
  build.tensors = build.tensors.device(device).dtype(dtype_);
  build.init.seed = static_cast<uint64_t>(c.train.seed);
  build.init.std = c.model.init_std;
  if (c.train.fp8) {  // each transformer layer's projections, as it is built (before it is split or sharded)
    float8_.emplace(*c.train.fp8, c.train.fp8_exclude, mesh.tp_size());
    build.on_layer = [this](const std::string& name, const std::shared_ptr<torch::nn::Module>& layer) {
      float8_->convert(name, *layer);
    };
  }
  if (c.parallel.strategy == parallel::Strategy::DDP) {
    model_ = build_replicated(c, std::move(recipe), build, mesh, device, load_report_);
    if (mesh.tp_size() > 1) {
      tp_ = models::tensor_parallelize(model_, mesh.tp_group(), {c.parallel.sequence_parallel, mesh.pp_size() > 1});
    }
    ddp::DdpOptions o;
    // Several stages a rank (interleaved): a backward reaches one stage's parameters, the others' left as they are
    // (averaged at their own stage's last backward, or still accumulating toward it).
    o.find_unused_parameters = has_unused || build.stages.size() > 1;
    o.bucket_cap_mb = c.parallel.bucket_cap_mb;
    o.gradient_as_bucket_view = c.parallel.gradient_as_bucket_view;
    ddp_ = models::replicate_model(model_, mesh, o);  // parameters are rank 0's from here on
  } else {
    model_ = build_sharded(c, std::move(recipe), build, mesh, load_report_, tp_);
    // The group FSDP shards gradients over (one rank alone under NO_SHARD): tensor parallelism's clipping sums there.
    if (tp_) shard_group_ = fsdp::strategy_groups(c.parallel.strategy, mesh).shard;
  }
  if (c.parallel.strategy == parallel::Strategy::DDP) {
    if (mesh.data_size() > 1) replicas_ = mesh.data_group();
  } else if (auto replicate = fsdp::strategy_groups(c.parallel.strategy, mesh).options.replicate_group;
             replicate && replicate->size() > 1) {
    replicas_ = std::move(replicate);
  }
  model_.module->train();
  if (float8_ && float8_->converted() == 0) {
    throw std::invalid_argument("train.fp8: " + to_string(*c.train.fp8) + " converts none of " + c.model.flavor +
                                "'s projections: " + float8_->describe());
  }
}

void ParallelModel::finish_gradients() {
  if (tp_) tp_->reduce_gradients();
}

void ParallelModel::set_gradient_sync(bool sync) {
  if (ddp_) {
    ddp_->set_requires_gradient_sync(sync);
  } else {
    fsdp::set_requires_gradient_sync(model_.module, sync);
  }
}

std::optional<optim::RowSharding> ParallelModel::row_sharding() const {
  if (ddp_) return std::nullopt;
  return fsdp::row_sharding(model_.module);
}

std::optional<optim::TensorSplit> ParallelModel::tensor_split() const {
  if (!tp_) return std::nullopt;
  return tp_->tensor_split();
}

double ParallelModel::clip_grad_norm(double max_norm, const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  if (tp_) {
    return tp_->clip_grad_norm(*model_.module, max_norm, shard_group_ ? &*shard_group_ : nullptr,
                               pp_group_ ? &*pp_group_ : nullptr);
  }
  if (!ddp_) return fsdp::clip_grad_norm(model_.module, max_norm, pp_group_ ? &*pp_group_ : nullptr);
  std::vector<at::Tensor> with_grad;
  for (const auto& g : groups) {
    for (const auto& p : g.params()) {
      if (p.grad().defined()) with_grad.push_back(p);
    }
  }
  if (!pp_group_) return torch::nn::utils::clip_grad_norm_(with_grad, max_norm);
  // A pipeline's stages: the norm over every stage's gradients (their squares summed over the pipeline group), each
  // stage scaled as torch's clip_grad_norm_ scales (by max_norm / (norm + 1e-6) when that is below 1).
  at::Tensor squares = at::zeros({1}, at::dtype(at::kDouble));
  for (const at::Tensor& p : with_grad) squares += p.grad().detach().to(at::kDouble).pow(2).sum().cpu();
  squares = squares.to(pp_group_->device());
  pp_group_->all_reduce(squares, dist::ReduceOp::SUM).wait();
  const double norm = std::sqrt(squares.cpu().item<double>()), scale = max_norm / (norm + 1e-6);
  if (scale < 1) {
    for (const at::Tensor& p : with_grad) p.grad().mul_(scale);
  }
  return norm;
}

}  // namespace shardtrain::train
