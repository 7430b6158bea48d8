// Adafactor (Shazeer & Stern 2018) as Hugging Face transformers' `Adafactor` computes it, the optimizer T5 is
// usually fine-tuned with. For a parameter of two or more dimensions (..., R, C) it keeps the second moment
// factored: a running mean of the squared gradient over the last dimension (the row statistics, shape (..., R))
// and over the one before it (the column statistics, (..., C)) instead of a full (..., R, C) copy, so its state is
// about R + C numbers per matrix rather than AdamW's 2 R C. Vectors and scalars keep a full second moment. The
// update is the gradient over the square root of that estimate, clipped to an RMS of clip_threshold, optionally
// smoothed by a first moment (beta1 > 0), times a learning rate that is either the schedule's (lr) or, with
// relative_step, min(1e-2, 1/sqrt(step)) (warmup_init: min(1e-6 step, 1/sqrt(step))), scaled with
// scale_parameter by the parameter's own RMS (at least eps2). Arithmetic is in float32 whatever the parameters'
// dtype; the state is float32.
//
// Sharded parameters (FSDP's dim-0 shards): a matrix's column statistics, the mean of its row statistics and
// every RMS span the whole parameter, so with `RowSharding` given, each step sums those few numbers across the
// shard group (two all-reduces per step for all parameters together) and every rank steps its rows exactly as
// one process stepping the whole parameter would, to float32 rounding. Parameters of three or more dimensions
// split on dim 0 need only the RMS sums: their statistics are per leading index.
//
// Tensor-parallel slices (`TensorSplit`, before FSDP shards them by rows): a slice of rows sums its column
// statistics, row-statistic mean and RMS over the tensor-parallel group too; a slice of columns sums each row's
// statistic over it (its column statistics are its own). Two all-reduces more per step. The statistics then are
// the whole parameter's, each rank's row or column statistics its slice's (or whole and equal on the group).
#pragma once

#include <torch/optim/optimizer.h>

#include <optional>

#include "shardtrain/optim/row_sharding.h"

namespace shardtrain::optim {

struct AdafactorOptions : public torch::optim::OptimizerCloneableOptions<AdafactorOptions> {
  AdafactorOptions(double lr = 1e-3);  // NOLINT: implicit, as LibTorch's AdamWOptions
  TORCH_ARG(double, lr) = 1e-3;             // unused with relative_step
  TORCH_ARG(double, eps1) = 1e-30;          // transformers' eps[0]: added to the squared gradient
  TORCH_ARG(double, eps2) = 1e-3;           // transformers' eps[1]: the least parameter scale
  TORCH_ARG(double, clip_threshold) = 1.0;  // the update's RMS is clipped to this
  TORCH_ARG(double, decay_rate) = -0.8;     // the second moment's decay at step t is 1 - t^decay_rate
  TORCH_ARG(double, beta1) = 0.0;           // the first moment's decay; 0: none kept (transformers' None)
  TORCH_ARG(double, weight_decay) = 0.0;    // decoupled, times the step's learning rate
  TORCH_ARG(bool, scale_parameter) = true;
  TORCH_ARG(bool, relative_step) = true;
  TORCH_ARG(bool, warmup_init) = false;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

// Tensors in float32. A factored parameter has row and column statistics, another the full exp_avg_sq; exp_avg
// only with beta1 > 0. The statistics of a sharded parameter have its shard's rows (padding rows stay zero) —
// except a matrix's column statistics, which are whole and equal on every rank of the shard group.
struct AdafactorParamState : public torch::optim::OptimizerCloneableParamState<AdafactorParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);         // like the parameter
  TORCH_ARG(at::Tensor, exp_avg_sq);      // like the parameter (not factored)
  TORCH_ARG(at::Tensor, exp_avg_sq_row);  // (..., R): parameter shape without the last dimension
  TORCH_ARG(at::Tensor, exp_avg_sq_col);  // (..., C): parameter shape without the second-to-last
};

class Adafactor : public torch::optim::Optimizer {
 public:
  // Throws std::invalid_argument naming an option out of range, or warmup_init without relative_step.
  explicit Adafactor(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdafactorOptions defaults = {},
                     std::optional<RowSharding> sharding = std::nullopt,
                     std::optional<TensorSplit> tensor_split = std::nullopt);
  explicit Adafactor(std::vector<at::Tensor> params, AdafactorOptions defaults = {},
                     std::optional<RowSharding> sharding = std::nullopt,
                     std::optional<TensorSplit> tensor_split = std::nullopt)
      : Adafactor({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults), std::move(sharding),
                  std::move(tensor_split)) {}

  // Collective over the sharding's group and the tensor-parallel group when there are: every rank calls it.
  at::Tensor step(LossClosure closure = nullptr) override;

  // A parameter's state at `step` with zero tensors of the shapes the optimizer would create, for a checkpoint to
  // fill.
  AdafactorParamState& empty_state(const at::Tensor& param, int64_t step);

  // Whether `param`'s column statistics span all its rows, and so are whole and equal on every rank of the shard
  // group (a matrix's); else they are split by rows like the parameter (a leading dimension before rows, columns).
  static bool column_statistics_are_whole(const at::Tensor& param) { return param.dim() == 2; }

 private:
  struct Pending;  // one parameter's step between the all-reduces (adafactor.cpp)
  AdafactorParamState& new_state(const at::Tensor& param, const AdafactorOptions& options, int64_t step);
  std::optional<RowSharding> sharding_;
  std::optional<TensorSplit> tensor_split_;
};

}  // namespace shardtrain::optim
