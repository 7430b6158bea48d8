#include "shardtrain/optim/param_groups.h"

namespace shardtrain::optim {

bool no_weight_decay(const std::string& name, const at::Tensor& parameter) {
  const std::string bias = "bias";
  const bool is_bias = name == bias || (name.size() > bias.size() &&
                                        name.compare(name.size() - bias.size() - 1, bias.size() + 1, "." + bias) == 0);
  return is_bias || parameter.dim() < 2;
}

std::vector<torch::optim::OptimizerParamGroup> param_groups_by_name(const torch::nn::Module& model,
                                                                   std::vector<NamedGroup> rules) {
  std::vector<std::vector<at::Tensor>> matched(rules.size() + 1);
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    size_t k = 0;
    while (k < rules.size() && !rules[k].match(item.key(), item.value())) ++k;
    matched[k].push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t k = 0; k < matched.size(); ++k) {
    if (matched[k].empty()) continue;
    if (k < rules.size() && rules[k].options) {
      groups.emplace_back(matched[k], rules[k].options->clone());
    } else {
      groups.emplace_back(matched[k]);
    }
  }
  return groups;
}

}  // namespace shardtrain::optim
