// The model zoo by name: a table of families (the family's name, its flavor names, and a recipe for each flavor;
// models/recipe.h), built from their flavor tables.
//
//   auto m = models::build_model("bert-base-uncased", build);   // m.module is a fully_shard-able root
//   models::load_weights(*m.module, "model.safetensors", m.names);
//   auto task = m.recipe->task();                                // what it trains on (its default task)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/models/build.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct FlavorName {
  std::string family;  // "flava", "bert", "vit", "t5", "llama"
  std::string flavor;  // "flava-350m", "bert-base-uncased", ...
};

// A row of the zoo's table: one family. Each family's recipe file (src/models/<family>_recipe.cpp) defines its row.
struct ModelFamily {
  std::string name;                                                        // "bert"
  std::vector<std::string> (*flavors)();                                   // its flavor names, table order
  std::shared_ptr<const ModelRecipe> (*recipe)(const std::string& flavor);  // flavor is one of flavors()
};

// Every flavor, family by family, in table order.
std::vector<FlavorName> list_flavors();

// The recipe of a flavor. Throws std::invalid_argument naming the flavor and the closest known one when it is
// unknown.
std::shared_ptr<const ModelRecipe> recipe_of(const std::string& flavor);

struct ZooModel {
  std::string family, flavor;
  std::shared_ptr<torch::nn::Module> module;  // the root (an nn::Interceptable: the root unit of sharding)
  NameMap names;                              // to Hugging Face parameter names
  std::string layer_class;                    // the transformer layer class ("BertLayer"), the default wrap unit
  std::shared_ptr<const ModelRecipe> recipe;  // everything else the system knows about the family
};

// Builds a flavor. Throws std::invalid_argument naming the flavor and the closest known one when it is unknown.
ZooModel build_model(const std::string& flavor, const BuildOptions& build = {});
ZooModel build_model(std::shared_ptr<const ModelRecipe> recipe, const BuildOptions& build = {});

// The family's transformer layer class of a flavor ("FlavaLayer"), without building it.
std::string layer_class_of(const std::string& flavor);

// Exact parameter count of a flavor (tied tensors once), from shapes only: built on the meta device.
int64_t count_flavor_parameters(const std::string& flavor);

}  // namespace shardtrain::models
