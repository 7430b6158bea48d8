// AnyPrecision AdamW's step as a single pass over memory on the CPU: each parameter, its gradient, both moments
// and the compensation buffer are read once and written once, each element widened to float32, updated and
// rounded back, all parameters of a step split over the threads in one go. The per-operation step (about ten ATen
// operations, each a pass over memory) is what CPU offload pays for otherwise.
//
// Arithmetic is float32 throughout and each tensor is rounded to its dtype once, when stored, rather than after
// every operation: a bf16 moment is the float32 AdamW moment rounded once, and with Kahan summation the
// compensation keeps exactly what rounding the parameter dropped, weight decay's product included.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace shardtrain::optim {

// One step's scalars for one parameter (its step count already incremented).
struct AdamWStepScalars {
  double decay = 1;                  // 1 - lr * weight_decay, the weights' factor before the update
  double beta1 = 0.9, beta2 = 0.999;
  double sqrt_bias_correction2 = 1;  // sqrt(1 - beta2^step)
  double eps = 1e-8;
  double step_size = 1e-3;           // lr / (1 - beta1^step)
};

// Whether the fused kernel takes these tensors: all on the CPU, contiguous, of one size, each float32 or bf16,
// the gradient in the parameter's dtype. `compensation` is undefined without Kahan summation.
bool fused_anyprecision_takes(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                              const at::Tensor& exp_avg_sq, const at::Tensor& compensation);

// One parameter's part of a fused step: its tensors (compensation undefined without Kahan summation) and scalars.
struct AnyPrecisionTensors {
  at::Tensor param, grad, exp_avg, exp_avg_sq, compensation;
  AdamWStepScalars scalars;
};

// The step in place for all of them in one pass, their elements split evenly over ATen's intra-op thread count
// (run on its inter-op pool: ATen's own parallel_for needs OpenMP in the calling file), as AnyPrecisionAdamW's
// per-operation step computes it up to where each tensor is rounded. Each must pass fused_anyprecision_takes.
void fused_anyprecision_step(const std::vector<AnyPrecisionTensors>& params);

}  // namespace shardtrain::optim
