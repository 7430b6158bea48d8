// The model zoo by name: every flavor of every family, built from its flavor table.
//
//   auto m = models::build_model("bert-base-uncased", build);   // m.module is a fully_shard-able root
//   models::load_weights(*m.module, "model.safetensors", m.names);
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/models/build.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct FlavorName {
  std::string family;  // "flava", "bert", "vit", "t5", "llama"
  std::string flavor;  // "flava-350m", "bert-base-uncased", ...
};

// Every flavor, family by family, in table order.
std::vector<FlavorName> list_flavors();

struct ZooModel {
  std::string family, flavor;
  std::shared_ptr<torch::nn::Module> module;  // the root (an nn::Interceptable: the root unit of sharding)
  NameMap names;                              // to Hugging Face parameter names
  std::string layer_class;                    // the transformer layer class ("BertLayer"), the default wrap unit
};

// Builds a flavor. Throws std::invalid_argument naming the flavor and the closest known one when it is unknown.
ZooModel build_model(const std::string& flavor, const BuildOptions& build = {});

// The family's transformer layer class of a flavor ("FlavaLayer"), without building it.
std::string layer_class_of(const std::string& flavor);

// Exact parameter count of a flavor (tied tensors once), from shapes only: built on the meta device.
int64_t count_flavor_parameters(const std::string& flavor);

}  // namespace shardtrain::models
