// AnyPrecision AdamW (torchdistx's AnyPrecisionAdamW, which the T5 post trains pure bf16 with): AdamW whose two
// moments live in a dtype of their own (bf16 by default) and which can keep, per parameter, a compensation buffer
// with the part of each update the parameter's own dtype could not hold (Kahan summation). With bf16 parameters,
// moments and compensation that is 2 + 2 + 2 + 2 bytes of state per parameter (plus a bf16 gradient) instead of
// 4 + 4 + 4 + 4 for float32 masters with AdamW, and without the compensation, small updates to bf16 weights round
// away entirely.
//
// With every dtype float32 and no Kahan summation it computes what torch::optim::AdamW computes (bitwise with
// fused(false), to float32 rounding fused). Scalars
// (betas, eps, decay) enter its bf16 and float16 ops at float precision, as in torchdistx's Python.
#pragma once

#include <torch/optim/optimizer.h>

#include <tuple>

namespace shardtrain::optim {

struct AnyPrecisionAdamWOptions : public torch::optim::OptimizerCloneableOptions<AnyPrecisionAdamWOptions> {
  AnyPrecisionAdamWOptions(double lr = 1e-3);  // NOLINT: implicit, as LibTorch's AdamWOptions
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(bool, use_kahan_summation) = false;
  TORCH_ARG(at::ScalarType, momentum_dtype) = at::kBFloat16;
  TORCH_ARG(at::ScalarType, variance_dtype) = at::kBFloat16;
  TORCH_ARG(at::ScalarType, compensation_buffer_dtype) = at::kBFloat16;
  // One pass over each parameter's memory on the CPU (float32 and bf16 tensors, contiguous), with float32
  // arithmetic and each tensor rounded once; on a GPU, with the state in the parameters' dtype (pure bf16), ATen's
  // multi-tensor operations (a few kernels for all of a group's tensors, rounded after each operation as ATen's
  // per-tensor ones). false, or other tensors: ATen's operations tensor by tensor.
  TORCH_ARG(bool, fused) = true;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AnyPrecisionAdamWParamState
    : public torch::optim::OptimizerCloneableParamState<AnyPrecisionAdamWParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);       // momentum_dtype
  TORCH_ARG(at::Tensor, exp_avg_sq);    // variance_dtype
  TORCH_ARG(at::Tensor, compensation);  // compensation_buffer_dtype; undefined without Kahan summation
};

class AnyPrecisionAdamW : public torch::optim::Optimizer {
 public:
  // Throws std::invalid_argument naming an option out of range (lr, betas, eps, weight_decay).
  explicit AnyPrecisionAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                             AnyPrecisionAdamWOptions defaults = {});
  explicit AnyPrecisionAdamW(std::vector<at::Tensor> params, AnyPrecisionAdamWOptions defaults = {})
      : AnyPrecisionAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  at::Tensor step(LossClosure closure = nullptr) override;

  // A parameter's state with zero tensors in the dtypes of its group's options, for a checkpoint to fill.
  AnyPrecisionAdamWParamState& empty_state(const at::Tensor& param, int64_t step);

 private:
  AnyPrecisionAdamWParamState& new_state(const at::Tensor& param, const AnyPrecisionAdamWOptions& options,
                                         int64_t step);
};

}  // namespace shardtrain::optim
