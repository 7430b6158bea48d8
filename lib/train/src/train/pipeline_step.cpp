#include "train/pipeline_step.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace shardtrain::train {

// A stage of the run's model whose backward reduces its gradients over the data-parallel ranks at the step's last
// weight gradients only (FSDP's gradient sync, as gradient accumulation's last micro-batch).
class PipelineStep::TrainStage : public models::LlamaStage {
 public:
  TrainStage(models::Llama model, int64_t run, int divisor, std::function<models::MicrobatchText(int)> text,
             ParallelModel& parallel, const bool& sync, bool sync_each, const optim::GradScaler* scaler)
      : LlamaStage(std::move(model), run, divisor, std::move(text)), parallel_(parallel), sync_(sync),
        sync_each_(sync_each), scaler_(scaler) {}
  // train.sync_each_batch: every microbatch's backward reduces (no full gradients kept between them).
  void before_backward(bool last) override { parallel_.set_gradient_sync((last && sync_) || sync_each_); }
  double loss_scale() const override { return scaler_ ? scaler_->scale_value() : 1.0; }

 private:
  ParallelModel& parallel_;
  const bool& sync_;
  bool sync_each_;
  const optim::GradScaler* scaler_;
};

PipelineStep::PipelineStep(const config::Config& c, ParallelModel& model, const dist::DeviceMesh& mesh,
                           std::vector<models::StageLayers> split, const optim::GradScaler* scaler)
    : split_(std::move(split)), group_(mesh.pp_group()) {
  const pp::ScheduleShape shape = config::pipeline_shape(c);
  auto llama = std::dynamic_pointer_cast<models::LlamaImpl>(model.module());
  if (!llama) throw std::invalid_argument("parallel.pp_size: the model is not built as Llama's pipeline stages");
  const int divisor = static_cast<int>(shape.microbatches * c.train.grad_accum);
  auto text = [this](int m) {
    return models::MicrobatchText{rows_of(text_.attention_mask, m), rows_of(text_.labels, m)};
  };
  std::map<int, pp::Stage*> mine;
  for (int s = 0, run = 0; s < shape.stages(); ++s) {
    if (shape.rank_of(s) != mesh.pp_rank()) continue;
    stages_.push_back(std::make_unique<TrainStage>(models::Llama(llama), run++, divisor, text, model, sync_,
                                                   c.train.sync_each_batch, scaler));
    mine[s] = stages_.back().get();
  }
  pipeline_ = std::make_unique<pp::Pipeline>(pp::make_schedule(shape), group_, std::move(mine));
}

PipelineStep::~PipelineStep() = default;

void PipelineStep::take(const data::Batch& batch) {
  const int microbatches = schedule().shape.microbatches;
  rows_ = batch.input_ids.size(0) / microbatches;
  if (rows_ * microbatches != batch.input_ids.size(0)) {
    throw std::invalid_argument("pipeline: a batch of " + std::to_string(batch.input_ids.size(0)) +
                                " rows does not split into " + std::to_string(microbatches) + " microbatches");
  }
  ids_ = batch.input_ids;
  text_ = models::causal_lm_text(batch);
}

at::Tensor PipelineStep::rows_of(const at::Tensor& t, int microbatch) const {
  return t.narrow(0, microbatch * rows_, rows_);
}

void PipelineStep::release() { ids_ = at::Tensor(), text_ = {}; }

std::pair<at::Tensor, int64_t> PipelineStep::token_loss(const data::Batch& batch) {
  take(batch);
  const std::vector<at::Tensor> losses = pipeline_->forward_only([this](int m) { return rows_of(ids_, m); });
  // Each microbatch's mean over its predicted tokens, weighed by them: the batch's sum (on the last stage's rank).
  at::Tensor sum = at::zeros({1}, at::dtype(at::kDouble).device(group_.device()));
  int64_t tokens = 0;
  for (int m = 0; m < schedule().shape.microbatches; ++m) {
    const int64_t n = models::predicted_tokens({at::Tensor(), rows_of(text_.labels, m)});
    tokens += n;
    if (!losses.empty()) sum += losses[static_cast<size_t>(m)].detach().to(at::kDouble).reshape({1}) * n;
  }
  release();
  if (group_.size() > 1) group_.all_reduce(sum, dist::ReduceOp::SUM).wait();
  return {sum.reshape({}), tokens};
}

double PipelineStep::forward_backward(const data::Batch& batch, bool sync) {
  take(batch);
  sync_ = sync;
  const pp::StepResult result = pipeline_->step([this](int m) { return rows_of(ids_, m); });
  release();
  // The loss is the last stage's: every rank of the pipeline reports it.
  at::Tensor loss = at::full({1}, result.loss, at::dtype(at::kDouble)).to(group_.device());
  if (group_.size() > 1) group_.all_reduce(loss, dist::ReduceOp::SUM).wait();
  return loss.cpu().item<double>();
}

}  // namespace shardtrain::train
