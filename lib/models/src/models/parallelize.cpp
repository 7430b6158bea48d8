#include "shardtrain/models/parallelize.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/activation_offload.h"

namespace shardtrain::models {

namespace {

// The strategy's groups with the caller's runtime options.
fsdp::StrategyGroups groups_for(const dist::DeviceMesh& mesh, const ParallelizeOptions& options) {
  fsdp::StrategyGroups groups = fsdp::strategy_groups(options.strategy, mesh);
  fsdp::FsdpOptions merged = options.fsdp;
  merged.reshard_after_forward = groups.options.reshard_after_forward;
  merged.replicate_group = groups.options.replicate_group;
  groups.options = merged;
  return groups;
}

std::vector<std::string> layer_classes_of(const ZooModel& model, const ParallelizeOptions& options) {
  return options.layer_classes.empty() ? std::vector<std::string>{model.layer_class} : options.layer_classes;
}

// The units by class: the layers' and the family's own (recipe.h: extra_unit_classes, edge_unit_classes).
std::vector<std::string> unit_classes_of(const ZooModel& model, const ParallelizeOptions& options) {
  std::vector<std::string> classes = layer_classes_of(model, options);
  for (const auto& c : model.recipe->own_unit_classes()) classes.push_back(c);
  return classes;
}

void check_every(int64_t every, const char* caller) {
  if (every < 0) {
    throw std::invalid_argument(std::string(caller) + ": activation_checkpoint_every = " + std::to_string(every) +
                                ", expected 0 (none), 1 (every layer) or k > 1 (every k-th layer)");
  }
}

// What the family needs from the data-parallel world once the root is wrapped (FLAVA: the contrastive group).
void finish_root(ZooModel& model, const dist::DeviceMesh& mesh) { model.recipe->parallelize_hook(*model.module, mesh); }

}  // namespace

std::vector<std::string> activation_checkpoint_layers(ZooModel& model, int64_t every,
                                           const std::vector<std::string>& layer_classes) {
  if (every < 1) {
    throw std::invalid_argument("activation_checkpoint_layers: every = " + std::to_string(every) + ", expected >= 1");
  }
  const std::vector<std::string> classes = layer_classes.empty() ? std::vector<std::string>{model.layer_class}
                                                                 : layer_classes;
  int64_t seen = 0;
  auto names = nn::apply_activation_checkpointing(model.module, [&](const std::string&, torch::nn::Module& m) {
    if (std::find(classes.begin(), classes.end(), fsdp::module_class_name(m)) == classes.end()) return false;
    return ++seen % every == 0;
  });
  if (seen == 0) {
    throw std::invalid_argument("activation_checkpoint_layers: no module of class " + classes.front() + " in the " +
                                model.family + " model");
  }
  return names;
}

std::vector<std::string> activation_offload_layers(ZooModel& model, const std::vector<std::string>& layer_classes) {
  const std::vector<std::string> classes = layer_classes.empty() ? std::vector<std::string>{model.layer_class}
                                                                 : layer_classes;
  auto names = nn::apply_activation_offloading(model.module, [&](const std::string&, torch::nn::Module& m) {
    return std::find(classes.begin(), classes.end(), fsdp::module_class_name(m)) != classes.end();
  });
  if (names.empty()) {
    throw std::invalid_argument("activation_offload_layers: no module of class " + classes.front() + " in the " +
                                model.family + " model");
  }
  return names;
}

std::vector<fsdp::FsdpUnit> parallelize(ZooModel& model, const dist::DeviceMesh& mesh,
                                        const ParallelizeOptions& options) {
  check_every(options.activation_checkpoint_every, "parallelize");
  if (options.activation_checkpoint_every > 0) {
    activation_checkpoint_layers(model, options.activation_checkpoint_every, options.layer_classes);
  }
  const fsdp::StrategyGroups groups = groups_for(mesh, options);
  auto units = fsdp::fully_shard_model(model.module, groups.shard,
                                       options.policy ? *options.policy
                                                      : fsdp::wrap_by_class_name(unit_classes_of(model, options)),
                                       groups.options);
  if (options.activation_offload) activation_offload_layers(model, options.layer_classes);
  finish_root(model, mesh);
  return units;
}

ddp::Ddp replicate_model(ZooModel& model, const dist::DeviceMesh& mesh, const ddp::DdpOptions& options) {
  ddp::Ddp handle = ddp::replicate(model.module, mesh.data_group(), options);
  finish_root(model, mesh);
  return handle;
}

ZooModel build_parallel(const std::string& flavor, const dist::DeviceMesh& mesh, const ParallelizeOptions& options,
                        BuildOptions build) {
  return build_parallel(recipe_of(flavor), mesh, options, std::move(build));
}

namespace {

// build_parallel, and with `tp` each layer split before it is sharded and the rest split before its units are.
ZooModel build_sharded(std::shared_ptr<const ModelRecipe> recipe, const dist::DeviceMesh& mesh,
                       const ParallelizeOptions& options, BuildOptions build, TensorParallelizer* tp) {
  if (options.policy) throw std::invalid_argument("build_parallel: a wrap policy needs the whole model; use parallelize");
  check_every(options.activation_checkpoint_every, "build_parallel");
  const fsdp::StrategyGroups groups = groups_for(mesh, options);
  const std::string flavor = recipe->flavor();
  const std::string family_layer = recipe->layer_class();
  for (const auto& c : options.layer_classes) {
    if (c != family_layer) {
      throw std::invalid_argument("build_parallel: layer class '" + c + "' is not " + flavor +
                                  "'s transformer layer '" + family_layer + "'; build the model, then parallelize()");
    }
  }
  auto user_hook = build.on_layer;
  int64_t layers_built = 0;
  build.on_layer = [&](const std::string& name, const std::shared_ptr<torch::nn::Module>& layer) {
    if (user_hook) user_hook(name, layer);
    if (tp != nullptr) tp->split_layer(name, *layer);
    if (options.activation_checkpoint_every > 0 && ++layers_built % options.activation_checkpoint_every == 0) {
      nn::apply_activation_checkpoint(*layer, {}, name);
    }
    fsdp::fully_shard(layer, groups.shard, groups.options);
  };
  ZooModel model = build_model(recipe, build);
  return model;
}

// The family's own units (extra and edge units), then the root: the layers are units already. A pipeline stage's
// model (`stage`) holds the embedding or the head only at the ends of the stack.
void shard_the_rest(ZooModel& model, const dist::DeviceMesh& mesh, const ParallelizeOptions& options, bool stage) {
  const fsdp::StrategyGroups groups = groups_for(mesh, options);
  std::vector<std::string> classes = model.recipe->own_unit_classes();
  if (stage) {
    std::set<std::string> present;
    for (const auto& item : model.module->named_modules()) present.insert(fsdp::module_class_name(*item.value()));
    classes.erase(std::remove_if(classes.begin(), classes.end(), [&](const std::string& c) { return !present.count(c); }),
                  classes.end());
  }
  fsdp::fully_shard_model(model.module, groups.shard, fsdp::wrap_by_class_name(classes), groups.options);
  if (options.activation_offload) activation_offload_layers(model, options.layer_classes);
  finish_root(model, mesh);
}

}  // namespace

ZooModel build_parallel(std::shared_ptr<const ModelRecipe> recipe, const dist::DeviceMesh& mesh,
                        const ParallelizeOptions& options, BuildOptions build) {
  const bool stage = !build.stages.empty();
  ZooModel model = build_sharded(std::move(recipe), mesh, options, std::move(build), nullptr);
  shard_the_rest(model, mesh, options, stage);
  return model;
}

TensorParallelModel build_tensor_parallel(std::shared_ptr<const ModelRecipe> recipe, const dist::DeviceMesh& mesh,
                                          const ParallelizeOptions& options, const TensorParallelOptions& tp_options,
                                          BuildOptions build) {
  const bool stage = !build.stages.empty();
  TensorParallelOptions split_options = tp_options;
  split_options.pipeline_stage = stage;
  TensorParallelizer tp(*recipe, mesh.tp_group(), split_options);
  ZooModel model = build_sharded(std::move(recipe), mesh, options, std::move(build), &tp);
  TensorParallel split = tp.finish(*model.module);
  shard_the_rest(model, mesh, options, stage);
  return {std::move(model), std::move(split)};
}

}  // namespace shardtrain::models
