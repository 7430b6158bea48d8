// AnyPrecision AdamW's step as ATen's multi-tensor (_foreach_) operations: the per-operation step's arithmetic,
// operation for operation, over lists of tensors. On CUDA each operation is a handful of kernel launches for the
// whole list instead of one per tensor (about ten operations per tensor; FLAVA-350m has some 900 tensors), with
// scalars at float precision (the kernels' opmath type). On the CPU ATen runs them tensor by tensor and rounds the
// scalars to each tensor's dtype first, so the optimizer uses this for GPU tensors only (foreach_anyprecision_takes);
// in float32 the two agree.
#pragma once

#include <vector>

#include "optim/anyprecision_kernel.h"

namespace shardtrain::optim {

// Whether the list step takes these tensors: on a GPU, contiguous, all in the parameter's dtype (compensation
// undefined without Kahan summation) — what ATen's list kernels run in one launch per list, scalars at float
// precision. Others would take ATen's per-tensor fallback, whose scalars LibTorch rounds to the tensor's dtype.
bool foreach_anyprecision_takes(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                                const at::Tensor& exp_avg_sq, const at::Tensor& compensation);

// The step in place for all of them, as AnyPrecisionAdamW's per-operation step computes it (bitwise in float32):
// weight decay, both moments in their own dtypes, the bias-corrected update, and where `compensation` is defined,
// Kahan summation. Tensors are listed together by device and dtypes; every one must share beta1 and beta2 (one
// parameter group), steps may differ. Throws std::invalid_argument for tensors of different betas.
void foreach_anyprecision_step(const std::vector<AnyPrecisionTensors>& params);

}  // namespace shardtrain::optim
