#include "shardtrain/models/zoo.h"

#include <algorithm>
#include <stdexcept>

#include "models/families.h"
#include "util/closest_match.h"

namespace shardtrain::models {

namespace {

// The zoo: one row per family, in the order `shardtrain models` lists them.
const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> table = {flava_family(), bert_family(), vit_family(), t5_family(),
                                                 llama_family()};
  return table;
}

}  // namespace

std::vector<FlavorName> list_flavors() {
  std::vector<FlavorName> out;
  for (const auto& family : families()) {
    for (const auto& f : family.flavors()) out.push_back({family.name, f});
  }
  return out;
}

std::shared_ptr<const ModelRecipe> recipe_of(const std::string& flavor) {
  for (const auto& family : families()) {
    const auto flavors = family.flavors();
    if (std::find(flavors.begin(), flavors.end(), flavor) != flavors.end()) return family.recipe(flavor);
  }
  std::vector<std::string> known;
  for (const auto& f : list_flavors()) known.push_back(f.flavor);
  throw std::invalid_argument("unknown model flavor '" + flavor + "' (did you mean '" +
                              util::closest_match(flavor, known) +
                              "'? `shardtrain models` lists them all)");
}

ZooModel build_model(std::shared_ptr<const ModelRecipe> recipe, const BuildOptions& build) {
  ZooModel model{recipe->family(), recipe->flavor(), recipe->build(build), recipe->hf_names(), recipe->layer_class(),
                 nullptr};
  model.recipe = std::move(recipe);
  return model;
}

ZooModel build_model(const std::string& flavor, const BuildOptions& build) {
  return build_model(recipe_of(flavor), build);
}

std::string layer_class_of(const std::string& flavor) { return recipe_of(flavor)->layer_class(); }

int64_t count_flavor_parameters(const std::string& flavor) {
  BuildOptions meta;
  meta.tensors = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  return count_parameters(*build_model(flavor, meta).module);
}

}  // namespace shardtrain::models
