// Small pieces the family recipes share (private to the models layer).
#pragma once

#include <ATen/core/Tensor.h>

#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/models/recipe.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::models {

// What every family's recipe holds the same way: its names, its config, how its module is built. `Holder` is the
// family's TORCH_MODULE holder (Bert), constructed from (Config, BuildOptions). A family's recipe derives from it
// and adds its FLOPs formula, tasks and hooks.
template <class Config, class Holder>
class FamilyRecipe : public ModelRecipe {
 public:
  FamilyRecipe(std::string family, std::string flavor, const Config& config, NameMap (*names)(),
               std::string layer_class)
      : family_(std::move(family)),
        flavor_(std::move(flavor)),
        config_(config),
        names_(names),
        layer_class_(std::move(layer_class)) {}
  std::string family() const override { return family_; }
  std::string flavor() const override { return flavor_; }
  std::shared_ptr<torch::nn::Module> build(const BuildOptions& options) const override {
    return Holder(config_, options).ptr();
  }
  NameMap hf_names() const override { return names_(); }
  std::string layer_class() const override { return layer_class_; }

 protected:
  const Config& config() const { return config_; }

 private:
  std::string family_, flavor_;
  Config config_;
  NameMap (*names_)();
  std::string layer_class_;
};

// The parameters of `module` (tied ones once, under their first name) as Hugging Face tensors: those whose Hugging
// Face name starts with `keep_prefix`, with that prefix removed ("bert." of BertForMaskedLM's names gives BertModel's).
std::vector<HfTensor> hf_parameters(const torch::nn::Module& module, const NameMap& names,
                                    const std::string& keep_prefix = "");

// The family's module class behind a recipe's root (tasks receive the root as a torch::nn::Module).
template <class Impl>
Impl& module_as(torch::nn::Module& module, const std::string& family) {
  auto* impl = dynamic_cast<Impl*>(&module);
  if (!impl) throw std::invalid_argument("a " + family + " task was given a module that is not a " + family + " model");
  return *impl;
}

// A tensor's value as a double, for the logs.
inline double value_of(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

// Rows of a micro-batch, and its text length in tokens (0 without text).
inline double batch_rows(const data::Batch& b) {
  return static_cast<double>((b.input_ids.defined() ? b.input_ids : b.pixels).size(0));
}
inline double text_tokens(const data::Batch& b) {
  return b.input_ids.defined() ? static_cast<double>(b.input_ids.size(1)) : 0;
}

// The kind a family cannot read, for training_flops.
[[noreturn]] inline void throw_unread_kind(const std::string& flavor, const data::Batch& b) {
  throw std::invalid_argument(flavor + " reads no " + std::string(data::kind_name(b.kind)) + " batches");
}

}  // namespace shardtrain::models
