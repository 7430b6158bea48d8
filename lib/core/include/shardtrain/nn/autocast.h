// Automatic mixed precision on a module's calls: its forward runs under LibTorch's autocast for one device type —
// matrix products and convolutions in `dtype` (bfloat16 or float16), reductions, norms and losses in float32 —
// while its parameters, and so their gradients and the optimizer's state, stay float32. This is how a replicated
// (DDP) model trains in mixed precision, as Accelerate does without FSDP; fully_shard has its own policy
// (FsdpOptions::mixed_precision) that also gathers and reduces in low precision. Floating outputs leave the module
// in float32, so that losses computed outside it are in full precision. float16 needs loss scaling
// (optim/grad_scaler.h).
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace torch::nn {
class Module;
}

namespace shardtrain::nn {

// Throws std::invalid_argument when the module's class does not derive from nn::Interceptable, or when `dtype` is
// not bfloat16 or float16.
void autocast_module(torch::nn::Module& module, c10::DeviceType device_type, c10::ScalarType dtype);

}  // namespace shardtrain::nn
