// The model zoo by name: a table of families (the family's name, its flavor names, and a recipe for each flavor;
// models/recipe.h), built from their flavor tables.
//
//   auto m = models::build_model("bert-base-uncased", build);   // m.module is a fully_shard-able root
//   models::load_weights(*m.module, "model.safetensors", m.names);
//   auto task = m.recipe->task();                                // what it trains on (its default task)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/models/build.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct FlavorName {
  std::string family;  // "flava", "bert", "vit", "t5", "llama", "mistral", "qwen2", "qwen3"
  std::string flavor;  // "flava-350m", "bert-base-uncased", ...
};

class HfConfig;  // lib/models/src/models/hf_config.h: a config.json, read key by key

// A row of the zoo's table: one family. Each family's recipe file (lib/models/src/models/<family>/<family>_recipe.cpp) defines its row.
struct ModelFamily {
  std::string name;                                                        // "bert"
  std::vector<std::string> (*flavors)();                                   // its flavor names, table order
  std::shared_ptr<const ModelRecipe> (*recipe)(const std::string& flavor);  // flavor is one of flavors()
  std::string hf_model_type;                                               // config.json's model_type: "bert"
  // The model a config.json of this family describes, at its exact size, named `name`. Throws
  // std::invalid_argument naming the file and the key of an option the family does not implement.
  std::shared_ptr<const ModelRecipe> (*from_hf)(const HfConfig& config, const std::string& name);
  // The dimensions model.overrides may change, by our name ("layers"), each with the config.json keys that hold it
  // ("num_hidden_layers"; "text_config.hidden_size" inside a sub-config).
  std::vector<std::pair<std::string, std::vector<std::string>>> override_keys;
};

// Every flavor, family by family, in table order.
std::vector<FlavorName> list_flavors();

// The names model.overrides takes, family by family in table order: {"bert", {"layers", "dim", ...}}.
std::vector<std::pair<std::string, std::vector<std::string>>> override_names();

// The recipe of a flavor. Throws std::invalid_argument naming the flavor and the closest known one when it is
// unknown.
std::shared_ptr<const ModelRecipe> recipe_of(const std::string& flavor);

// The recipe of the model a Hugging Face config.json describes (`path`: the file or a directory holding it), any
// size, of a supported family (its `model_type`). The recipe's flavor() is `path`. Throws std::invalid_argument
// naming the path and the key for a missing file, an unknown model_type (listing the supported ones) or an option the
// family does not implement.
std::shared_ptr<const ModelRecipe> recipe_from_hf_config(const std::string& path);

// A flavor name, or else a config.json / model directory, or a model name ("org/name") in the Hugging Face cache
// (io::find_in_hf_cache): what a command given MODEL builds.
std::shared_ptr<const ModelRecipe> recipe_of_model(const std::string& flavor_or_path);
// The same with some dimensions changed (model.overrides: {"layers": 4, "dim": 512}, the family's override_keys):
// the model's config.json with those keys set, read as any config.json is (the same checks). Its flavor() is
// "<flavor> {dim: 512, layers: 4}". Throws std::invalid_argument naming an override the family does not have (and
// its names), a non-integer for an integer dimension, or what the family's reading refuses.
std::shared_ptr<const ModelRecipe> recipe_of_model(const std::string& flavor_or_path,
                                                   const std::map<std::string, double>& overrides);

struct ZooModel {
  std::string family, flavor;
  std::shared_ptr<torch::nn::Module> module;  // the root (an nn::Interceptable: the root unit of sharding)
  NameMap names;                              // to Hugging Face parameter names
  std::string layer_class;                    // the transformer layer class ("BertLayer"), the default wrap unit
  std::shared_ptr<const ModelRecipe> recipe;  // everything else the system knows about the family
};

// Builds a flavor. Throws std::invalid_argument naming the flavor and the closest known one when it is unknown, and
// naming the reason when build.stages asks for pipeline stages of a model that cannot have them
// (ModelRecipe::pipeline_stages_refused).
ZooModel build_model(const std::string& flavor, const BuildOptions& build = {});
ZooModel build_model(std::shared_ptr<const ModelRecipe> recipe, const BuildOptions& build = {});

// The family's transformer layer class of a flavor ("FlavaLayer"), without building it.
std::string layer_class_of(const std::string& flavor);

// Exact parameter count of a flavor (tied tensors once), from shapes only: built on the meta device.
int64_t count_flavor_parameters(const std::string& flavor);

}  // namespace shardtrain::models
