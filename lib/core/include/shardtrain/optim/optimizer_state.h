// What checkpoints need of the per-parameter state of the optimizers the trainer makes (torch::optim::AdamW,
// optim::FusedAdamW, optim::AnyPrecisionAdamW, optim::Adafactor, torch::optim::SGD): its step count and its tensors
// by name, and an empty state to fill from a file. Checkpoints store the tensors under these names (exp_avg,
// exp_avg_sq, and compensation for AnyPrecisionAdamW with Kahan summation; Adafactor's exp_avg_sq_row and
// exp_avg_sq_col; SGD's momentum_buffer, its step count 1: it keeps none), sharded as each tensor's split says.
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

// How a state tensor of a parameter split on dim 0 across a shard group (FSDP) is split itself.
enum class StateSplit {
  LIKE_PARAMETER,  // the parameter's shape on this rank (AdamW's moments)
  BY_ROWS,         // dim 0 is the parameter's dim 0 (this rank's rows), the other dimensions its own
  WHOLE,           // whole and equal on every rank of the shard group (Adafactor's column statistics of a matrix)
};

struct StateTensor {
  at::Tensor tensor;
  StateSplit split = StateSplit::LIKE_PARAMETER;
};

int64_t state_step(const torch::optim::OptimizerParamState& state);
// `param` is the parameter the state belongs to (as this rank holds it).
std::map<std::string, StateTensor> state_tensors(const torch::optim::OptimizerParamState& state,
                                                 const at::Tensor& param);

// Installs a state for `param` at `step` whose tensors are zeros of the dtypes the optimizer would create, and
// returns its tensors (to be overwritten). Throws std::invalid_argument for another kind of optimizer.
std::map<std::string, StateTensor> install_empty_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                                      int64_t step);

}  // namespace shardtrain::optim
