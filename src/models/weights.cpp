#include "shardtrain/models/weights.h"

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <stdexcept>

#include "shardtrain/models/safetensors.h"

namespace shardtrain::models {

namespace {

std::string shape_text(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::vector<std::pair<std::regex, std::string>> NameMap::compile(const Rules& rules) {
  std::vector<std::pair<std::regex, std::string>> out;
  for (const auto& [pattern, replacement] : rules) out.emplace_back(std::regex(pattern), replacement);
  return out;
}

NameMap::NameMap(const Rules& rules, const std::vector<std::string>& ignored, const Rules& aliases)
    : rules_(compile(rules)), aliases_(compile(aliases)) {
  for (const auto& pattern : ignored) ignored_.emplace_back(pattern);
}

std::vector<std::string> NameMap::aliases_of(const std::string& hf_name) const {
  std::vector<std::string> out;
  for (const auto& [pattern, replacement] : aliases_) {
    if (std::regex_match(hf_name, pattern)) out.push_back(std::regex_replace(hf_name, pattern, replacement));
  }
  return out;
}

std::string NameMap::to_hf(const std::string& name) const {
  for (const auto& [pattern, replacement] : rules_) {
    if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
  }
  return name;
}

bool NameMap::is_ignored(const std::string& hf_name) const {
  for (const auto& pattern : ignored_) {
    if (std::regex_match(hf_name, pattern)) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> hf_names_of(const torch::nn::Module& model, const NameMap& names) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), names.to_hf(p.key()));
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), names.to_hf(b.key()));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> hf_named_tensors(const torch::nn::Module& model, const NameMap& names) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) tensors.emplace(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) tensors.emplace(b.key(), b.value());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [ours, hf] : hf_names_of(model, names)) out.emplace_back(hf, tensors.at(ours));
  return out;
}

void load_weights(torch::nn::Module& model, const std::string& path, const NameMap& names) {
  SafetensorsReader file(path);
  auto fail = [&](const std::string& what) { return std::runtime_error("load_weights '" + path + "': " + what); };
  auto wanted = hf_named_tensors(model, names);

  // The base-model prefix Hugging Face drops or adds ("bert." when a BertModel is saved alone): find the file name.
  auto file_name_of = [&](const std::string& hf) -> std::string {
    std::vector<std::string> candidates = {hf};
    for (const auto& alias : names.aliases_of(hf)) candidates.push_back(alias);
    for (const auto& name : candidates) {
      if (file.find(name)) return name;
      const size_t dot = name.find('.');
      if (dot != std::string::npos && file.find(name.substr(dot + 1))) return name.substr(dot + 1);
    }
    return "";
  };
  std::set<std::string> used;
  std::vector<std::pair<std::string, at::Tensor*>> plan;
  for (auto& [hf, tensor] : wanted) {
    const std::string in_file = file_name_of(hf);
    if (in_file.empty()) throw fail("tensor '" + hf + "' of the model is missing from the file");
    const SafetensorsEntry* e = file.find(in_file);
    if (c10::IntArrayRef(e->shape) != tensor.sizes()) {
      throw fail("tensor '" + in_file + "' has shape " + shape_text(e->shape) + ", the model expects " +
                 shape_text(tensor.sizes()));
    }
    used.insert(in_file);
    plan.emplace_back(in_file, &tensor);
  }
  for (const auto& e : file.entries()) {
    if (!used.count(e.name) && !names.is_ignored(e.name)) {
      throw fail("tensor '" + e.name + "' in the file matches nothing in the model");
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [in_file, tensor] : plan) tensor->copy_(file.read(in_file));
}

void save_weights(const torch::nn::Module& model, const std::string& path, const NameMap& names,
                  std::optional<at::ScalarType> dtype) {
  auto tensors = hf_named_tensors(model, names);
  if (dtype) {
    for (auto& [name, t] : tensors) {
      if (t.is_floating_point()) t = t.to(*dtype);
    }
  }
  write_safetensors(path, tensors);
}

}  // namespace shardtrain::models
