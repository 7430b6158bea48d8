// The first lines of every optimizer's step (private to optim/): the closure, when given, evaluated with
// gradients on, as LibTorch's optimizers do; its loss is step()'s result.
#pragma once

#include <c10/core/GradMode.h>
#include <torch/optim/optimizer.h>

namespace shardtrain::optim {

inline at::Tensor evaluate_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode grad(true);
  return closure();
}

}  // namespace shardtrain::optim
