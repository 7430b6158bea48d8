// What checkpoints need of the per-parameter state of the optimizers the trainer makes (torch::optim::AdamW,
// optim::FusedAdamW, optim::AnyPrecisionAdamW, torch::optim::SGD): its step count and its tensors by name, and an
// empty state to fill from a file. Checkpoints store the tensors under these names (exp_avg, exp_avg_sq, and
// compensation for AnyPrecisionAdamW with Kahan summation; SGD's momentum_buffer, its step count 1: it keeps none),
// sharded like the parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
}  // namespace torch::optim

namespace shardtrain::optim {

int64_t state_step(const torch::optim::OptimizerParamState& state);
std::map<std::string, at::Tensor> state_tensors(const torch::optim::OptimizerParamState& state);

// Installs a state for `param` at `step` whose tensors are zeros of the dtypes the optimizer would create, and
// returns its tensors (to be overwritten). Throws std::invalid_argument for another kind of optimizer.
std::map<std::string, at::Tensor> install_empty_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                                      int64_t step);

}  // namespace shardtrain::optim
