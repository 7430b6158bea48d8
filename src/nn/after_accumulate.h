// A hook that runs a callback after an AccumulateGrad node filled its parameter's .grad: LibTorch's equivalent of
// Python's register_post_accumulate_grad_hook (docs/notes/libtorch.md §2). Used by fully_shard and replicate.
#pragma once

#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace shardtrain::nn {

struct AfterAccumulate : torch::autograd::FunctionPostHook {
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }
  std::function<void()> fn_;
};

}  // namespace shardtrain::nn
