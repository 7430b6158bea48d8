// Helpers for the recipes' hf_base_model(): our module's parameters under Hugging Face's names.
#include <torch/nn/module.h>

#include <set>

#include "models/recipe_helpers.h"

namespace shardtrain::models {

std::vector<HfTensor> hf_parameters(const torch::nn::Module& module, const NameMap& names,
                                    const std::string& keep_prefix) {
  std::vector<HfTensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    const std::string hf = names.to_hf(p.key());
    if (hf.compare(0, keep_prefix.size(), keep_prefix) != 0) continue;
    out.push_back({hf.substr(keep_prefix.size()), p.value().sizes().vec(), p.value().scalar_type(), false});
  }
  return out;
}

}  // namespace shardtrain::models
