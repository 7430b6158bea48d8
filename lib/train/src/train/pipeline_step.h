// The pipeline of a run with parallel.pp_size above 1 (private to the train layer): the stages this rank holds of
// the model (ParallelModel builds only their layers), each data-parallel batch split into the schedule's
// microbatches and run by pp::Pipeline over the mesh's pipeline group.
#pragma once

#include <memory>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/optim/grad_scaler.h"
#include "shardtrain/pp/pipeline.h"
#include "train/parallel_model.h"

namespace shardtrain::train {

class PipelineStep {
 public:
  // `model`: built with models::stages_of_rank(...) of `split` (every stage's layers). The losses are divided by the
  // schedule's microbatches x train.grad_accum, so that a step's gradients are the mean over its microbatches.
  // `scaler` (float16): the last stage's backward starts from its scale.
  PipelineStep(const config::Config& c, ParallelModel& model, const dist::DeviceMesh& mesh,
               std::vector<models::StageLayers> split, const optim::GradScaler* scaler = nullptr);
  ~PipelineStep();
  PipelineStep(const PipelineStep&) = delete;
  PipelineStep& operator=(const PipelineStep&) = delete;

  // Forward and backward of one data-parallel batch (on the compute device; input_ids, attention_mask), the
  // gradients added to .grad: reduced over the data-parallel ranks by each stage's last backward when `sync`, only
  // accumulated otherwise. Returns the batch's share of the step's loss (the sum of its microbatches' divided
  // losses), the same on every rank of the pipeline. Collective over the pipeline's group and the stages' units'.
  double forward_backward(const data::Batch& batch, bool sync);
  // Evaluation (models::EvalInputs::pipeline_token_loss): one batch's forwards through the stages without
  // gradients; its summed token loss (each microbatch's mean times its predicted tokens) and predicted tokens, the
  // same on every rank of the pipeline. Collective over the pipeline's group.
  std::pair<at::Tensor, int64_t> token_loss(const data::Batch& batch);

  const pp::Schedule& schedule() const { return pipeline_->schedule(); }
  const std::vector<models::StageLayers>& split() const { return split_; }

 private:
  class TrainStage;

  std::vector<models::StageLayers> split_;
  dist::Communicator group_;
  std::vector<std::unique_ptr<TrainStage>> stages_;
  std::unique_ptr<pp::Pipeline> pipeline_;
  // The batch being run: its microbatches' rows, token ids (stage 0's input), mask and labels (what the stages'
  // text() reads).
  int64_t rows_ = 0;
  at::Tensor ids_;
  models::MicrobatchText text_;
  bool sync_ = true;
  // Holds `batch` for the step (rows_, ids_, text_); throws naming a batch that does not split into the schedule's
  // microbatches. release() lets it go.
  void take(const data::Batch& batch);
  void release();
  at::Tensor rows_of(const at::Tensor& t, int microbatch) const;  // microbatch's rows of a (B, ...) tensor
};

}  // namespace shardtrain::train
