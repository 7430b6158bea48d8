#include "shardtrain/models/zoo.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "models/families.h"
#include "models/hf_config.h"
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

std::shared_ptr<const ModelRecipe> recipe_from_hf_config(const std::string& path) {
  const HfConfig config = HfConfig::read(path);
  const std::string type = config.text("model_type", "");
  std::vector<std::string> known;
  for (const auto& family : families()) {
    if (family.hf_model_type == type) return family.from_hf(config, path);
    known.push_back("'" + family.hf_model_type + "'");
  }
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  throw std::invalid_argument(config.where() + ": model_type '" + type + "' is not a family shardtrain implements (" +
                              list + ")");
}

std::shared_ptr<const ModelRecipe> recipe_of_model(const std::string& flavor_or_path) {
  const std::string& m = flavor_or_path;
  const bool json = m.size() >= 5 && m.compare(m.size() - 5, 5, ".json") == 0;
  if (std::filesystem::exists(m) || json || m.find('/') != std::string::npos) return recipe_from_hf_config(m);
  try {
    return recipe_of(m);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(e.what()) + "; a Hugging Face config.json or model directory works too");
  }
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
  return count_parameters(*build_model(flavor, meta_build()).module);
}

}  // namespace shardtrain::models
