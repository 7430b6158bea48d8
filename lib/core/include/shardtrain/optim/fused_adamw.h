// AdamW whose step is one fused kernel over all of a group's parameters of a device and dtype (ATen's
// _fused_adamw_: vectorised and multi-threaded on the CPU, a multi-tensor kernel on CUDA) instead of LibTorch's
// loop of about ten ATen operations per parameter, each one pass over memory. Same options, state type
// (torch::optim::AdamWParamState, so checkpoints and state dicts are unchanged) and results to float32 rounding.
// AMSGrad, sparse or non-contiguous tensors take LibTorch's step. On CPU offload the step runs on the host, where
// this matters most: bench/optimizer_bench.cpp measures it against the memory-bandwidth bound.
#pragma once

#include <torch/optim/adamw.h>

namespace shardtrain::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace shardtrain::optim
