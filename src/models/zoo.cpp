#include "shardtrain/models/zoo.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "shardtrain/models/bert.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"
#include "util/closest_match.h"

namespace shardtrain::models {

namespace {

struct Family {
  std::string name;
  std::function<std::vector<std::string>()> flavors;
  std::function<std::shared_ptr<torch::nn::Module>(const std::string&, const BuildOptions&)> build;
  std::function<NameMap()> names;
  std::string layer_class;
};

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"flava", flava_flavors,
       [](const std::string& f, const BuildOptions& b) { return Flava(flava_flavor(f), b).ptr(); }, flava_names,
       "FlavaLayer"},
      {"bert", bert_flavors,
       [](const std::string& f, const BuildOptions& b) { return Bert(bert_flavor(f), b).ptr(); }, bert_names,
       "BertLayer"},
      {"vit", vit_flavors, [](const std::string& f, const BuildOptions& b) { return Vit(vit_flavor(f), b).ptr(); },
       vit_names, "ViTLayer"},
      {"t5", t5_flavors, [](const std::string& f, const BuildOptions& b) { return T5(t5_flavor(f), b).ptr(); },
       t5_names, "T5Block"},
      {"llama", llama_flavors,
       [](const std::string& f, const BuildOptions& b) { return Llama(llama_flavor(f), b).ptr(); }, llama_names,
       "LlamaDecoderLayer"},
  };
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

namespace {

const Family& family_of(const std::string& flavor) {
  for (const auto& family : families()) {
    const auto flavors = family.flavors();
    if (std::find(flavors.begin(), flavors.end(), flavor) != flavors.end()) return family;
  }
  std::vector<std::string> known;
  for (const auto& f : list_flavors()) known.push_back(f.flavor);
  throw std::invalid_argument("unknown model flavor '" + flavor + "' (did you mean '" +
                              util::closest_match(flavor, known) +
                              "'? `shardtrain models` lists them all)");
}

}  // namespace

ZooModel build_model(const std::string& flavor, const BuildOptions& build) {
  const Family& family = family_of(flavor);
  return ZooModel{family.name, flavor, family.build(flavor, build), family.names(), family.layer_class};
}

std::string layer_class_of(const std::string& flavor) { return family_of(flavor).layer_class; }

int64_t count_flavor_parameters(const std::string& flavor) {
  BuildOptions meta;
  meta.tensors = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kMeta);
  return count_parameters(*build_model(flavor, meta).module);
}

}  // namespace shardtrain::models
