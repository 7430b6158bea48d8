#include "shardtrain/models/zoo.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "models/families.h"
#include "models/hf_config.h"
#include "shardtrain/io/hf_cache.h"
#include "shardtrain/util/closest_match.h"

namespace shardtrain::models {

namespace {

// The zoo: one row per family, in the order `shardtrain models` lists them.
const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> table = {flava_family(), bert_family(),    vit_family(), t5_family(),
                                                 llama_family(), mistral_family(), qwen2_family(),
                                                 qwen3_family(), gpt2_family()};
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

std::vector<std::pair<std::string, std::vector<std::string>>> override_names() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& family : families()) {
    out.push_back({family.name, {}});
    for (const auto& key : family.override_keys) out.back().second.push_back(key.first);
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
  if (std::filesystem::exists(m) || json) return recipe_from_hf_config(m);
  // A model name: a flavor of the zoo first, then a model in the Hugging Face cache (from_pretrained's offline
  // lookup); "org/name" is never a flavor.
  if (m.find('/') != std::string::npos) return recipe_from_hf_config(io::resolve_hf_model(m, "model"));
  try {
    return recipe_of(m);
  } catch (const std::invalid_argument& e) {
    if (auto snapshot = io::find_in_hf_cache(m)) return recipe_from_hf_config(*snapshot);
    throw std::invalid_argument(std::string(e.what()) + "; a Hugging Face config.json, model directory or model " +
                                "name in the Hugging Face cache (" + io::hf_hub_cache_dir() + ") works too");
  }
}

std::shared_ptr<const ModelRecipe> recipe_of_model(const std::string& flavor_or_path,
                                                   const std::map<std::string, double>& overrides) {
  auto base = recipe_of_model(flavor_or_path);
  if (overrides.empty()) return base;
  const ModelFamily* family = nullptr;
  for (const auto& f : families()) {
    if (f.name == base->family()) family = &f;
  }
  std::vector<std::string> names;
  for (const auto& [name, keys] : family->override_keys) names.push_back(name);
  nlohmann::json config = nlohmann::json::parse(base->hf_config_json());
  std::ostringstream label;
  label << base->flavor() << " {";
  for (const auto& override : overrides) {
    const std::string& name = override.first;
    const double value = override.second;
    auto it = std::find_if(family->override_keys.begin(), family->override_keys.end(),
                           [&](const auto& k) { return k.first == name; });
    if (it == family->override_keys.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw std::invalid_argument("model.overrides: '" + name + "' is not a dimension of a " + family->name +
                                  " model (did you mean '" + util::closest_match(name, names) + "'? " +
                                  family->name + "'s: " + list + ")");
    }
    for (const std::string& key : it->second) {
      nlohmann::json* node = &config;
      std::string rest = key;
      for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
        node = &(*node)[rest.substr(0, dot)];
      }
      nlohmann::json& slot = (*node)[rest];
      if (slot.is_number_integer() && value != std::floor(value)) {
        std::ostringstream v;
        v << value;
        throw std::invalid_argument("model.overrides: " + name + " is " + v.str() + " (expected a whole number)");
      }
      // A key the config.json leaves out (null: Llama's head_dim, Mistral v0.3's window) takes a whole number as
      // one: the integer keys read nothing else, the real ones read it as well.
      const bool whole = (slot.is_number_integer() || slot.is_null()) && value == std::floor(value);
      if (whole) slot = static_cast<int64_t>(value);
      else slot = value;
    }
    label << (label.str().back() == '{' ? "" : ", ") << name << ": " << value;
  }
  label << "}";
  const std::string text = config.dump();
  return family->from_hf(HfConfig::parse(text, base->flavor() + " with model.overrides"), label.str());
}

ZooModel build_model(std::shared_ptr<const ModelRecipe> recipe, const BuildOptions& build) {
  if (!build.stages.empty()) {
    if (const std::string why = recipe->pipeline_stages_refused(); !why.empty()) {
      throw std::invalid_argument(recipe->flavor() + " cannot be built as pipeline stages: " + why);
    }
  }
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
