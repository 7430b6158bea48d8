#include "shardtrain/models/float8.h"

#include <algorithm>
#include <regex>

#include "shardtrain/models/layers.h"

namespace shardtrain::models {
namespace {

constexpr int64_t kTensorCoreMultiple = 16;  // float8 GEMMs' sizes (torchao leaves other layers in high precision)

// "layers.3.attn.q" -> "layers.*.attn.q": one line for a projection of every layer.
std::string pattern_of(const std::string& name) { return std::regex_replace(name, std::regex("\\.\\d+\\."), ".*."); }

// The distinct patterns of `names` in order, the first 4 then how many more: "layers.*.attn.q, layers.*.mlp.up".
std::string patterns(const std::vector<std::string>& names) {
  std::vector<std::string> seen;
  for (const std::string& n : names) {
    const std::string p = pattern_of(n);
    if (std::find(seen.begin(), seen.end(), p) == seen.end()) seen.push_back(p);
  }
  std::string out;
  for (size_t i = 0; i < seen.size() && i < 4; ++i) out += (i ? ", " : "") + seen[i];
  if (seen.size() > 4) out += " and " + std::to_string(seen.size() - 4) + " more";
  return out;
}

}  // namespace

Float8Layers::Float8Layers(parallel::Float8Recipe recipe, std::vector<std::string> exclude, int64_t tp)
    : recipe_(recipe), exclude_(std::move(exclude)), tp_(tp) {}

void Float8Layers::convert(const std::string& name, torch::nn::Module& layer) {
  for (const auto& item : layer.named_modules(name)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear == nullptr) continue;
    const std::string& path = item.key();
    if (path.find("lora_A") != std::string::npos || path.find("lora_B") != std::string::npos) continue;
    const bool excluded = std::any_of(exclude_.begin(), exclude_.end(), [&](const std::string& e) {
      return path == e || path.rfind(e + ".", 0) == 0;
    });
    if (excluded) {
      excluded_.push_back(path);
      continue;
    }
    const at::Tensor m = linear->matrix();  // (out, in), whole: before tensor parallelism splits one of them
    if (m.size(0) % (kTensorCoreMultiple * tp_) != 0 || m.size(1) % (kTensorCoreMultiple * tp_) != 0) {
      indivisible_.push_back(path + ": " + std::to_string(m.size(0)) + " x " + std::to_string(m.size(1)));
      continue;
    }
    linear->float8 = recipe_;
    converted_.push_back(path);
    if (linear->has_lora()) ++frozen_;
  }
}

std::string Float8Layers::describe() const {
  std::string out = "float8 " + parallel::to_string(recipe_) + ": " + std::to_string(converted_.size()) +
                    " projections of the transformer layers (" + patterns(converted_) +
                    "); the embeddings, heads and adapters in the activations' dtype";
  if (frozen_ > 0) out += "; " + std::to_string(frozen_) + " of them frozen under LoRA adapters";
  if (!excluded_.empty()) {
    std::string given;
    for (const std::string& e : exclude_) given += (given.empty() ? "" : ", ") + e;
    out += "; " + std::to_string(excluded_.size()) + " excluded (train.fp8_exclude: " + given + ")";
  }
  if (!indivisible_.empty()) {
    out += "; " + std::to_string(indivisible_.size()) + " whose sizes do not divide by " +
           std::to_string(kTensorCoreMultiple * tp_) + " (" + indivisible_.front() +
           (indivisible_.size() > 1 ? ", ..." : "") + ")";
  }
  return out;
}

}  // namespace shardtrain::models
