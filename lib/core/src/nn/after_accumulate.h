// A hook that runs a callback after an AccumulateGrad node filled its parameter's .grad: LibTorch's equivalent of
// Python's register_post_accumulate_grad_hook (docs/notes/libtorch.md §2). Used by fully_shard and replicate.
#pragma once

#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace shardtrain::nn {

struct AfterAccumulate : torch::autograd::FunctionPostHook {
  explicit AfterAccumulate(std::function<void()> fn) : fn_(std::move(fn)) {}
  // `inputs` is the engine's own list of the node's incoming gradients, kept for the post hooks and dropped after
  // them. AccumulateGrad has consumed it by now (stolen into .grad or added there), so it is released before the
  // callback: a callback that takes .grad away (fully_shard moves a unit's gradients into its reduce-scatter)
  // then frees it instead of holding it twice for the collective — an untied LM head's or embedding's whole
  // gradient (docs/notes/libtorch.md §2). Hooks added after this one see no inputs.
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    const_cast<torch::autograd::variable_list&>(inputs).clear();
    fn_();
    return outputs;
  }
  std::function<void()> fn_;
};

}  // namespace shardtrain::nn
