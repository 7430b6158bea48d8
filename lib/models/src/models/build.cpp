#include "shardtrain/models/build.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <set>

#include "shardtrain/models/layers.h"

namespace shardtrain::models {

// splitmix64 over an FNV-1a hash of the name: a well-mixed 64-bit seed per (seed, name). Its offset basis is a digit
// short of FNV's (so not util::fnv1a): kept, since every seeded initialisation, and tests' expectations of them,
// follow from it.
uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string leaf_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

void init_parameters(torch::nn::Module& module, const std::string& prefix, const WeightInitOptions& options,
                     const std::vector<std::string>& skip_prefixes) {
  at::NoGradGuard no_grad;
  // Norm scales: the `weight` of every LayerNorm / RMSNorm below `module`.
  std::set<const c10::TensorImpl*> norm_weights;
  // (include_self would need `module` in a shared_ptr, which it is not yet inside its constructor.)
  auto note_norm = [&norm_weights](const torch::nn::Module& m) {
    if (!is_norm_layer(m)) return;
    if (const auto* w = m.named_parameters(false).find("weight")) norm_weights.insert(w->unsafeGetTensorImpl());
  };
  note_norm(module);
  for (const auto& item : module.named_modules("", /*include_self=*/false)) note_norm(*item.value());
  for (auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string name = prefix.empty() ? item.key() : prefix + "." + item.key();
    bool skip = false;
    for (const auto& s : skip_prefixes) skip = skip || starts_with(name, s + ".");
    at::Tensor& p = item.value();
    if (skip || p.is_meta() || p.numel() == 0) continue;
    const std::string leaf = leaf_of(name);
    if (leaf == "bias") {
      p.zero_();
    } else if (leaf == "reattn_weights") {
      p.copy_(at::eye(p.size(0)));  // DeepViT re-attention starts as plain attention
    } else if (norm_weights.count(p.unsafeGetTensorImpl())) {
      p.fill_(1.0);
    } else {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(options.seed, name));
      at::Tensor values = at::empty(p.sizes(), at::TensorOptions().dtype(at::kFloat));
      values.normal_(0.0, options.std, generator);
      p.copy_(values);
    }
  }
}

void fill_constant(at::Tensor& parameter, double value) {
  at::NoGradGuard no_grad;
  if (!parameter.is_meta()) parameter.fill_(value);
}

void finish_layer(const BuildOptions& options, const std::string& name,
                  const std::shared_ptr<torch::nn::Module>& layer, std::vector<std::string>& built) {
  init_parameters(*layer, name, options.init);
  built.push_back(name);
  if (options.on_layer) options.on_layer(name, layer);
}

void finish_model(const BuildOptions& options, torch::nn::Module& model, const std::vector<std::string>& built) {
  init_parameters(model, "", options.init, built);
}

BuildOptions meta_build() {
  BuildOptions b;
  b.tensors = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  return b;
}

int64_t count_parameters(const torch::nn::Module& module) {
  std::set<const c10::TensorImpl*> seen;
  int64_t total = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) total += p.numel();
  }
  return total;
}

}  // namespace shardtrain::models
