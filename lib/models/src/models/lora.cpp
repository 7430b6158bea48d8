#include "shardtrain/models/lora.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>

#include "shardtrain/io/files.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/util/with_commas.h"

namespace shardtrain::models {
namespace {

const char* kAllLinear = "all-linear";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string leaf_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The module part of a tensor's name: "a.b.weight" -> "a.b".
std::string module_of(const std::string& tensor_name) {
  const size_t dot = tensor_name.rfind('.');
  return dot == std::string::npos ? "" : tensor_name.substr(0, dot);
}

// A layer's module by its name inside the layer: what follows the first index ("model.layers.3.self_attn.q_proj" ->
// "self_attn.q_proj"), which PEFT's rule below matches in every layer and nowhere else (BERT's "output.dense" is
// in each layer; its pooler's "dense" would match a bare leaf).
std::string within_layer(const std::string& module) {
  size_t at = 0;
  while ((at = module.find('.', at)) != std::string::npos) {
    const size_t end = module.find('.', at + 1);
    const std::string part = module.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos && end != std::string::npos) {
      return module.substr(end + 1);
    }
    ++at;
  }
  return module;
}

// PEFT's rule for a list of module names: the name is one of them, or ends in "." + one. Returns the one matched.
const std::string* matched(const std::string& module, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (n == kAllLinear || module == n || ends_with(module, "." + n)) return &n;
  }
  return nullptr;
}

// `matched` for the module or any module above it ("bert.pooler.dense" is in "bert.pooler"): PEFT wraps a module to
// save whole, with everything inside it.
const std::string* matched_above(const std::string& module, const std::vector<std::string>& names) {
  for (size_t end = module.find('.'); end != std::string::npos; end = module.find('.', end + 1)) {
    if (const std::string* hit = matched(module.substr(0, end), names)) return hit;
  }
  return matched(module, names);
}

// PEFT's task types SEQ_CLS and TOKEN_CLS save the classifier ("classifier", or "score" in other models). A model
// with one trains the pooler the classifier reads too (a masked-LM checkpoint has none: PEFT would leave it random
// and frozen); FLAVA's poolers, of a model without a classifier, stay frozen.
const std::vector<std::string>& default_heads() {
  static const std::vector<std::string> names = {"classifier", "score"};
  return names;
}
const char* kDefaultPooler = "pooler";

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void check_spec(const LoraSpec& spec) {
  if (spec.r < 0) {
    throw std::invalid_argument("model.lora.r is " + std::to_string(spec.r) + ", expected 0 (off) or more");
  }
  if (!(spec.lora_alpha > 0)) {
    throw std::invalid_argument("model.lora.lora_alpha is " + std::to_string(spec.lora_alpha) + ", expected > 0");
  }
  if (!(spec.lora_dropout >= 0 && spec.lora_dropout < 1)) {
    throw std::invalid_argument("model.lora.lora_dropout is " + std::to_string(spec.lora_dropout) +
                                ", expected a probability in [0, 1)");
  }
}

// Adapts and freezes a model as it is built. One per build() call: it records what matched for the checks at the end.
class Adapter {
 public:
  Adapter(const LoraSpec& spec, NameMap names, const WeightInitOptions& init)
      : spec_(spec), names_(std::move(names)), init_(init),
        saves_(spec.modules_to_save.empty() ? default_heads() : spec.modules_to_save) {
    first_layer_.frozen = true, first_layer_.r = spec.r, first_layer_.dropout = spec.lora_dropout;
  }

  // A transformer layer `name`, built and initialised: adapters on its target Linears, every other parameter frozen
  // but modules_to_save's.
  void layer(const std::string& name, torch::nn::Module& layer) {
    layers_.push_back(name);
    std::vector<std::pair<std::string, LinearImpl*>> linears;
    for (const auto& item : layer.named_modules(name, /*include_self=*/false)) {
      auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
      if (linear && item.key().find(".lora_") == std::string::npos) linears.emplace_back(item.key(), linear);
    }
    if (linear_leaves_.empty()) {  // the first layer's, for the default targets and for errors
      for (const auto& [path, linear] : linears) {
        linear_leaves_.push_back(leaf_of(hf_module(path)));
        // PEFT's defaults: the query and value projections, or GPT-2's c_attn that makes both.
        if (ends_with(path, ".attn.q") || ends_with(path, ".attn.v") || ends_with(path, ".attn.qkv")) {
          default_targets_.push_back(linear_leaves_.back());
        }
      }
    }
    const std::vector<std::string>& targets = spec_.target_modules.empty() ? default_targets_ : spec_.target_modules;
    const bool first = layers_.size() == 1;
    for (const auto& [path, linear] : linears) {
      const std::string* hit = matched(hf_module(path), targets);
      if (!hit) continue;
      hits_.insert(*hit);
      linear->add_lora(spec_.r, spec_.lora_alpha, spec_.lora_dropout);
      init_adapter(path, *linear);
      if (first) count_adapted(leaf_of(path));
    }
    freeze(layer, name);
  }

  // The first layer's adapted projections, for the memory model (ActivationQuery::Adapters).
  const ActivationQuery::Adapters& first_layer() const { return first_layer_; }

  // The rest of the model (after every layer): frozen but modules_to_save's; then the checks.
  void rest(torch::nn::Module& root) {
    if (spec_.modules_to_save.empty()) {
      for (const auto& item : root.named_parameters(/*recurse=*/true)) {
        if (matched_above(module_of(names_.to_hf(item.key())), default_heads())) {
          saves_.push_back(kDefaultPooler);
          break;
        }
      }
    }
    for (auto& item : root.named_parameters(/*recurse=*/true)) {
      bool in_layer = false;
      for (const auto& l : layers_) in_layer = in_layer || starts_with(item.key(), l + ".");
      if (!in_layer) set_trainable(item.key(), item.value());
    }
    for (const auto& t : spec_.target_modules) {
      if (hits_.count(t) == 0) {
        throw std::invalid_argument("model.lora.target_modules: '" + t + "' is no Linear module of the model's " +
                                    "transformer layers; theirs are " + joined(linear_leaves_) + " (or all-linear)");
      }
    }
    for (const auto& m : spec_.modules_to_save) {
      if (saved_.count(m) == 0) {
        throw std::invalid_argument("model.lora.modules_to_save: '" + m + "' is no module of the model");
      }
    }
  }

 private:
  std::string hf_module(const std::string& path) const { return module_of(names_.to_hf(path + ".weight")); }

  // Our blocks' Linear names (blocks.h): attention's q, k, v (or qkv), o; the MLP's fc1 or gate and up, then fc2
  // or down.
  void count_adapted(const std::string& leaf) {
    ActivationQuery::Adapters& a = first_layer_;
    if (leaf == "q" || leaf == "k" || leaf == "v" || leaf == "qkv") ++a.qkv;
    if (leaf == "o") ++a.o;
    if (leaf == "fc1" || leaf == "gate" || leaf == "up") ++a.mlp_in;
    if (leaf == "fc2" || leaf == "down") ++a.mlp_out;
  }

  // PEFT's initialisation: A kaiming_uniform_(a=sqrt(5)), i.e. uniform(-1/sqrt(in), 1/sqrt(in)); B zero.
  void init_adapter(const std::string& path, LinearImpl& linear) const {
    at::NoGradGuard no_grad;
    at::Tensor a = linear.lora_A->weight, b = linear.lora_B->weight;
    if (a.is_meta()) return;
    const std::string name = path + ".lora_A.weight";
    auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(init_.seed, name));
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
    at::Tensor values = at::empty(a.sizes(), at::TensorOptions().dtype(at::kFloat));
    values.uniform_(-bound, bound, generator);
    a.copy_(values);
    b.zero_();
  }

  void freeze(torch::nn::Module& module, const std::string& prefix) {
    for (auto& item : module.named_parameters(/*recurse=*/true)) set_trainable(prefix + "." + item.key(), item.value());
  }

  void set_trainable(const std::string& name, at::Tensor& p) {
    if (is_lora_tensor(name)) return;
    const std::string* hit = matched_above(module_of(names_.to_hf(name)), saves_);
    if (hit) saved_.insert(*hit);
    p.set_requires_grad(hit != nullptr);
  }

  LoraSpec spec_;
  NameMap names_;
  WeightInitOptions init_;
  std::vector<std::string> saves_;  // modules_to_save, or the defaults (the pooler once a classifier is found)
  ActivationQuery::Adapters first_layer_;
  std::vector<std::string> layers_, linear_leaves_, default_targets_;
  std::set<std::string> hits_, saved_;
};

// ModelRecipe with adapters: build() adapts; every other question goes to the recipe it wraps.
class LoraRecipe : public ModelRecipe {
 public:
  // Builds the model on the meta device once: a target that matches nothing throws here, and the first layer's
  // adapters are known to the memory model.
  LoraRecipe(std::shared_ptr<const ModelRecipe> inner, const LoraSpec& spec) : inner_(std::move(inner)), spec_(spec) {
    adapters_ = build_adapted(meta_build()).second;
  }

  std::string family() const override { return inner_->family(); }
  std::string flavor() const override { return inner_->flavor(); }
  std::shared_ptr<torch::nn::Module> build(const BuildOptions& options) const override {
    return build_adapted(options).first;
  }
  NameMap hf_names() const override { return inner_->hf_names(); }
  std::string layer_class() const override { return inner_->layer_class(); }
  std::vector<std::string> extra_unit_classes() const override { return inner_->extra_unit_classes(); }
  EdgeUnits edge_unit_classes() const override { return inner_->edge_unit_classes(); }
  std::vector<std::string> tied_tables() const override { return inner_->tied_tables(); }
  TpPlan tp_plan() const override { return inner_->tp_plan(); }
  std::string pipeline_stages_refused() const override { return inner_->pipeline_stages_refused(); }
  HfModelLayout hf_base_model() const override { return inner_->hf_base_model(); }
  std::string hf_config_json() const override { return inner_->hf_config_json(); }
  // Of the three matrix products per weight a step makes (forward, the input's gradient, the weight's gradient),
  // backward skips the last for every frozen weight: 2/3 of the family's count. An approximation on two sides,
  // both small: attention's score products keep their 2x backward (their share of a layer's FLOPs is about
  // tokens / (6 dim): 17% at 256 tokens of dim 256, 3% at 512 of 4096), and the adapters' own products (r / dim of
  // a projection's) are not counted.
  double training_flops(const data::Batch& batch) const override { return inner_->training_flops(batch) * 2 / 3; }
  ActivationBytes activation_bytes(const ActivationQuery& query) const override {
    ActivationQuery adapted = query;
    adapted.adapters = adapters_;
    return inner_->activation_bytes(adapted);
  }
  std::unique_ptr<TextDecoder> text_decoder(torch::nn::Module& model) const override {
    return inner_->text_decoder(model);
  }
  void parallelize_hook(torch::nn::Module& root, const dist::DeviceMesh& mesh) const override {
    inner_->parallelize_hook(root, mesh);
  }
  std::vector<std::string> tasks() const override { return inner_->tasks(); }
  std::shared_ptr<const ModelRecipe> with_task_head(const std::string& task, const TaskSetup& setup) const override {
    auto headed = inner_->with_task_head(task, setup);
    return headed ? std::make_shared<LoraRecipe>(std::move(headed), spec_) : nullptr;
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string& name) const override { return inner_->task(name); }

 private:
  std::pair<std::shared_ptr<torch::nn::Module>, ActivationQuery::Adapters> build_adapted(
      const BuildOptions& options) const {
    Adapter adapter(spec_, inner_->hf_names(), options.init);
    BuildOptions adapted = options;
    adapted.on_layer = [&adapter, &options](const std::string& name, const std::shared_ptr<torch::nn::Module>& layer) {
      adapter.layer(name, *layer);
      if (options.on_layer) options.on_layer(name, layer);
    };
    auto root = inner_->build(adapted);
    adapter.rest(*root);
    return {root, adapter.first_layer()};
  }

  std::shared_ptr<const ModelRecipe> inner_;
  LoraSpec spec_;
  ActivationQuery::Adapters adapters_;
};

}  // namespace

std::shared_ptr<const ModelRecipe> with_lora(std::shared_ptr<const ModelRecipe> recipe, const LoraSpec& spec) {
  check_spec(spec);
  if (!spec.enabled()) return recipe;
  return std::make_shared<LoraRecipe>(std::move(recipe), spec);
}

LoraTargets lora_targets(const ModelRecipe& recipe, const LoraSpec& spec) {
  LoraTargets out;
  if (!spec.enabled()) return out;
  const auto meta = recipe.build(meta_build());
  const NameMap names = recipe.hf_names();
  std::set<std::string> leaves, saved;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : meta->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.total += item.value().numel();
    if (item.value().requires_grad()) out.trainable += item.value().numel();
    const std::string hf = names.to_hf(item.key());
    if (ends_with(item.key(), ".lora_A.weight")) {
      ++out.adapted_modules;
      const std::string module = within_layer(module_of(module_of(hf)));  // "...q_proj.lora_A.weight" -> "q_proj"
      if (leaves.insert(module).second) out.target_modules.push_back(module);
      out.fan_in_fan_out = out.fan_in_fan_out || names.is_transposed(module_of(module_of(hf)) + ".weight");
    } else if (!is_lora_tensor(item.key()) && item.value().requires_grad()) {
      static const std::vector<std::string> defaults = {default_heads()[0], default_heads()[1], kDefaultPooler};
      const std::string* hit =
          matched_above(module_of(hf), spec.modules_to_save.empty() ? defaults : spec.modules_to_save);
      if (hit && saved.insert(*hit).second) out.modules_to_save.push_back(*hit);
    }
  }
  return out;
}

std::string lora_label(const LoraSpec& spec, const LoraTargets& targets) {
  return "LoRA r " + std::to_string(spec.r) + " (" + std::to_string(targets.adapted_modules) + " modules; " +
         std::to_string(targets.trainable) + " of " + std::to_string(targets.total) + " parameters train)";
}

std::string describe_lora(const LoraSpec& spec, const LoraTargets& targets) {
  std::string text = "r " + std::to_string(spec.r);
  char numbers[96];
  std::snprintf(numbers, sizeof(numbers), ", lora_alpha %g, lora_dropout %g", spec.lora_alpha, spec.lora_dropout);
  text += numbers;
  text += " on " + std::to_string(targets.adapted_modules) + " modules (" + joined(targets.target_modules) + ")";
  if (!targets.modules_to_save.empty()) text += ", " + joined(targets.modules_to_save) + " trained whole";
  const double share =
      static_cast<double>(targets.trainable) / static_cast<double>(std::max<int64_t>(1, targets.total));
  std::snprintf(numbers, sizeof(numbers), "%.4f", 100.0 * share);
  return text + "; trainable params: " + util::with_commas(targets.trainable) +
         " || all params: " + util::with_commas(targets.total) + " || trainable%: " + numbers;
}

bool is_lora_tensor(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::vector<std::pair<std::string, at::Tensor>> merge_lora(std::vector<std::pair<std::string, at::Tensor>> tensors,
                                                           const LoraSpec& spec, const NameMap& names) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) index[tensors[i].first] = i;
  const double scale = spec.lora_alpha / static_cast<double>(spec.r);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : tensors) {
    if (!ends_with(name, ".lora_A.weight")) continue;
    const std::string module = name.substr(0, name.size() - std::string(".lora_A.weight").size());
    const auto b = index.find(module + ".lora_B.weight"), w = index.find(module + ".weight");
    if (b == index.end() || w == index.end()) {
      throw std::invalid_argument("LoRA adapter '" + name + "' has no " +
                                  (b == index.end() ? module + ".lora_B.weight" : module + ".weight") + " beside it");
    }
    at::Tensor& base = tensors[w->second].second;
    at::Tensor delta = at::matmul(tensors[b->second].second.to(at::kFloat), t.to(at::kFloat)) * scale;  // (out, in)
    if (names.is_transposed(w->first)) delta = delta.t();  // Conv1D's (in, out): PEFT's fan_in_fan_out
    base = (base.to(at::kFloat) + delta).to(base.scalar_type());
  }
  for (auto& [name, t] : tensors) {
    if (!is_lora_tensor(name)) out.emplace_back(std::move(name), std::move(t));
  }
  return out;
}

std::string lora_adapter_file(const std::string& dir) {
  for (const char* name : {"adapter_model.safetensors", "adapter_model.bin"}) {
    const std::string path = dir + "/" + name;
    if (io::path_exists(path)) return path;
  }
  throw std::invalid_argument("model.lora.from: '" + dir + "' holds no adapter_model.safetensors (nor " +
                              "adapter_model.bin): expected the directory PEFT's save_pretrained writes");
}

bool in_lora_adapter(const std::string& hf_name, const LoraTargets& targets) {
  return is_lora_tensor(hf_name) || matched_above(module_of(hf_name), targets.modules_to_save) != nullptr;
}

std::vector<std::pair<std::string, at::Tensor>> lora_adapter_tensors(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors, const LoraTargets& targets) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : tensors) {
    if (in_lora_adapter(name, targets)) out.emplace_back(kPeftModelPrefix + name, t);
  }
  return out;
}

std::string lora_adapter_config(const LoraSpec& spec, const LoraTargets& targets, const std::string& task,
                                const std::string& base_model) {
  static const std::map<std::string, std::string> task_types = {{"causal_lm", "CAUSAL_LM"},
                                                                {"seq2seq", "SEQ_2_SEQ_LM"},
                                                                {"classify", "SEQ_CLS"},
                                                                {"token_classify", "TOKEN_CLS"}};
  nlohmann::json j;
  j["peft_type"] = "LORA";
  const auto it = task_types.find(task);
  j["task_type"] = it == task_types.end() ? nlohmann::json() : nlohmann::json(it->second);
  j["base_model_name_or_path"] = base_model;
  j["r"] = spec.r;
  j["lora_alpha"] = spec.lora_alpha;
  j["lora_dropout"] = spec.lora_dropout;
  j["target_modules"] = targets.target_modules;
  j["modules_to_save"] = targets.modules_to_save.empty() ? nlohmann::json() : nlohmann::json(targets.modules_to_save);
  j["bias"] = "none";
  j["fan_in_fan_out"] = targets.fan_in_fan_out;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  return j.dump(2);
}

}  // namespace shardtrain::models
