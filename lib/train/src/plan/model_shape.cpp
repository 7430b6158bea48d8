// The model's parameters per FSDP unit, counted on a module tree built on the meta device.
#include "shardtrain/plan/memory_model.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>

#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/distributed/communicator.h"
#include "shardtrain/models/float8.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/util/with_commas.h"

namespace shardtrain::plan {

int64_t ModelShape::parameters() const {
  int64_t n = root_numel + extra_numel + input_numel + output_numel;
  for (int64_t l : layer_numel) n += l;
  return n;
}

int64_t ModelShape::trainable() const {
  int64_t n = root_trainable + extra_trainable + input_trainable + output_trainable;
  for (int64_t t : layer_trainable) n += t;
  return n;
}

namespace {

using TensorSet = std::set<const c10::TensorImpl*>;

// Calls f on each parameter of `m` not in `seen` yet, noting it there: a tied tensor once.
template <class F>
void each_new_parameter(const torch::nn::Module& m, TensorSet& seen, F f) {
  for (const auto& p : m.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) f(p);
  }
}

}  // namespace

// Tied tensors count once, in the first unit that holds them.
ModelShape model_shape(const models::ModelRecipe& recipe, int64_t tp, const std::vector<models::StageLayers>& stages) {
  models::BuildOptions build = models::meta_build();
  build.stages = stages;
  // Which projections float8 would convert, decided on the whole layers as the trainer does (before the split).
  models::Float8Layers float8(parallel::Float8Recipe::TENSORWISE, {}, tp);
  build.on_layer = [&](const std::string& name, const std::shared_ptr<torch::nn::Module>& layer) {
    float8.convert(name, *layer);
  };
  const auto root = recipe.build(build);
  if (tp > 1) {
    models::TensorParallelOptions split;
    split.pipeline_stage = !stages.empty();
    models::TensorParallelizer(recipe, dist::Communicator::shape_only(0, static_cast<int>(tp)), split).finish(*root);
  }
  TensorSet seen;
  ModelShape shape;
  shape.tp = tp;
  if (stages.empty()) shape.stage_shapes = std::make_shared<std::map<std::vector<int64_t>, ModelShape>>();
  auto count = [&](const torch::nn::Module& m, int64_t& all, int64_t& trainable) {
    each_new_parameter(m, seen, [&](const at::Tensor& p) {
      all += p.numel();
      if (p.requires_grad()) {
        trainable += p.numel();
        shape.largest_trainable_tensor = std::max(shape.largest_trainable_tensor, p.numel());
      }
    });
  };
  TensorSet listed;
  std::vector<const c10::TensorImpl*> trainable_order;
  each_new_parameter(*root, listed, [&](const at::Tensor& p) {
    if (!p.requires_grad()) return;
    shape.trainable_in_order.push_back(p.numel());
    trainable_order.push_back(p.unsafeGetTensorImpl());
  });
  const std::vector<std::string> extra = recipe.extra_unit_classes();
  const models::ModelRecipe::EdgeUnits edges = recipe.edge_unit_classes();
  const c10::TensorImpl* first_layer = nullptr;  // the first layer's first parameter
  for (const auto& m : root->modules(/*include_self=*/false)) {
    const std::string name = fsdp::module_class_name(*m);
    if (std::find(extra.begin(), extra.end(), name) != extra.end()) {
      count(*m, shape.extra_numel, shape.extra_trainable);
      continue;
    }
    if (!edges.input.empty() && name == edges.input) {
      count(*m, shape.input_numel, shape.input_trainable);
      continue;
    }
    if (!edges.output.empty() && name == edges.output) {
      count(*m, shape.output_numel, shape.output_trainable);
      continue;
    }
    if (name != recipe.layer_class()) continue;
    shape.layer_numel.push_back(0), shape.layer_trainable.push_back(0);
    shape.layer_float8.push_back(0), shape.layer_float8_io.push_back(0);
    count(*m, shape.layer_numel.back(), shape.layer_trainable.back());
    for (const auto& sub : m->modules(/*include_self=*/false)) {
      const auto* linear = dynamic_cast<const models::LinearImpl*>(sub.get());
      if (linear == nullptr || !linear->float8) continue;
      shape.layer_float8.back() += linear->weight.numel();
      shape.layer_float8_io.back() += linear->matrix().size(0) + linear->matrix().size(1);
    }
    if (first_layer == nullptr && !m->parameters().empty()) first_layer = m->parameters().front().unsafeGetTensorImpl();
  }
  // The root's own trainable parameters registered before the first layer's, its input side, but for the tables a
  // head shares (its gradient comes first).
  TensorSet tied;
  const auto named = root->named_parameters(/*recurse=*/true);
  for (const std::string& name : recipe.tied_tables()) {
    const at::Tensor* table = named.find(name);
    if (table == nullptr) {
      throw std::logic_error(recipe.flavor() + ": tied table '" + name + "' is not one of the model's parameters");
    }
    if (table->requires_grad() && tied.insert(table->unsafeGetTensorImpl()).second) shape.tied_tables += table->numel();
  }
  TensorSet input_side = tied;  // each tensor once (a tensor read twice is listed twice), the tied tables never
  for (const at::Tensor& p : root->parameters(/*recurse=*/true)) {
    const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    if (impl == first_layer) break;
    if (p.requires_grad() && seen.count(impl) == 0 && input_side.insert(impl).second) {
      shape.root_input_side += p.numel();
    }
  }
  count(*root, shape.root_numel, shape.root_trainable);
  // The modules the task's largest step leaves out, as far as the root holds them.
  const std::vector<std::string> left_out = recipe.task()->modules_without_gradient();
  TensorSet left_out_seen;
  for (const auto& item : root->named_modules()) {
    if (std::find(left_out.begin(), left_out.end(), item.key()) == left_out.end()) continue;
    each_new_parameter(*item.value(), left_out_seen, [&](const at::Tensor& p) {
      if (p.requires_grad()) shape.root_without_gradient += p.numel();
    });
  }
  shape.root_without_gradient = std::min(shape.root_without_gradient, shape.root_trainable);
  for (const c10::TensorImpl* p : trainable_order) shape.without_gradient_in_order.push_back(left_out_seen.count(p));
  TensorSet lookups_seen;
  for (const auto& m : root->modules(/*include_self=*/false)) {
    if (dynamic_cast<const models::LookupModule*>(m.get()) == nullptr) continue;
    const bool input = !edges.input.empty() && fsdp::module_class_name(*m) == edges.input;
    each_new_parameter(*m, lookups_seen, [&](const at::Tensor& p) {
      shape.lookup_tables += p.numel();
      if (input) shape.input_lookup_tables += p.numel();
    });
  }
  return shape;
}

std::vector<models::StageLayers> pipeline_stages(const ModelShape& shape, int stages,
                                                 const std::vector<int64_t>& split_points) {
  const int64_t layers = static_cast<int64_t>(shape.layer_numel.size());
  if (!split_points.empty()) return models::split_layers(layers, stages, split_points);
  if (stages > layers) {
    throw std::invalid_argument(std::to_string(stages) + " pipeline stages, but the model has " +
                                std::to_string(layers) + " layers: at most " + std::to_string(layers) +
                                " stages, one layer each at least");
  }
  std::vector<double> costs;
  for (int64_t n : shape.layer_numel) costs.push_back(6.0 * static_cast<double>(n));
  return models::balanced_split(costs, stages, 0, 6.0 * static_cast<double>(shape.output_numel));
}

std::vector<std::string> describe_pipeline_stages(const ModelShape& shape,
                                                  const std::vector<models::StageLayers>& split,
                                                  const pp::ScheduleShape& schedule) {
  std::vector<std::string> lines;
  const int stages = static_cast<int>(split.size());
  for (int s = 0; s < stages; ++s) {
    const models::StageLayers& mine = split[static_cast<size_t>(s)];
    int64_t params = 0;
    for (int64_t l = mine.first; l < mine.first + mine.count; ++l) params += shape.layer_numel[static_cast<size_t>(l)];
    if (s == 0) params += shape.input_numel;
    if (s + 1 == stages) params += shape.output_numel + shape.root_numel;
    const std::string held = mine.count == 1 ? "layer " + std::to_string(mine.first)
                                             : "layers " + std::to_string(mine.first) + "-" +
                                                   std::to_string(mine.first + mine.count - 1);
    lines.push_back("stage " + std::to_string(s) + " (rank " + std::to_string(schedule.rank_of(s)) + "): " + held +
                    (s == 0 ? " + embeddings" : "") + (s + 1 == stages ? " + norm, head, loss" : "") + ", " +
                    util::with_commas(params) + " parameters");
  }
  return lines;
}

}  // namespace shardtrain::plan
