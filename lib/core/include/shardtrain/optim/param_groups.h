// Optimizer parameter groups chosen by parameter name, for LibTorch's own optimizers. Names are those of
// named_parameters(), which fully_shard keeps, so the same rules apply to sharded and whole models.
//
//   auto groups = optim::param_groups_by_name(*model, {{optim::no_weight_decay, std::make_unique<AdamWOptions>(
//                                                         AdamWOptions(lr).weight_decay(0))}});
//   torch::optim::AdamW optimizer(std::move(groups), AdamWOptions(lr).weight_decay(0.1));
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::optim {

using ParameterRule = std::function<bool(const std::string& name, const at::Tensor& parameter)>;

struct NamedGroup {
  ParameterRule match;
  std::unique_ptr<torch::optim::OptimizerOptions> options;  // null: the optimizer's defaults
};

// The usual exemption from weight decay: biases and every parameter with fewer than two dimensions (norm weights
// and biases, scalars). Decided on the name and the number of dimensions, which sharding keeps.
bool no_weight_decay(const std::string& name, const at::Tensor& parameter);

// One group per rule, in order, holding the parameters it matches first; then a group with the optimizer's
// defaults for the rest. Empty groups are left out. Parameters that do not require grad are left out.
std::vector<torch::optim::OptimizerParamGroup> param_groups_by_name(const torch::nn::Module& model,
                                                                   std::vector<NamedGroup> rules);

}  // namespace shardtrain::optim
