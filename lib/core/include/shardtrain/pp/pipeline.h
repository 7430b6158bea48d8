// One rank's part of a pipeline: runs its list of a schedule (pp/schedule.h) on the stages it holds, moving
// activations forward and their gradients back over the pipeline's group by point-to-point messages.
//
//   pp::Schedule schedule = pp::make_schedule({ONE_F_ONE_B, /*ranks=*/4, /*stages_per_rank=*/1, /*microbatches=*/8});
//   pp::Pipeline pipeline(schedule, pp_group, {{rank, &my_stage}});
//   pipeline.step([&](int m) { return microbatch_input(m); });  // gradients accumulate into .grad; then step the
//                                                               // optimizer as without a pipeline
//
// A forward's output is sent to the next stage's rank as soon as it is computed and each backward's input gradient
// to the previous stage's (a stage followed by one on the same rank hands it over in memory); receives wait for what
// the action needs. The first message across each stage boundary carries the activation's shape and dtype, which
// every later one keeps (pad to one length; a change is an error naming the stage). Backward splits for zero bubble:
// I is the input gradient alone (torch::autograd::grad, the graph kept), W the weights' — the whole backward again,
// the input's gradient recomputed and dropped: a backward restricted to the parameters (autograd's `inputs`) finds
// them by their gradient accumulators, which FSDP's mixed precision replaces when it swaps a parameter's dtype, and
// then accumulates nothing. The last stage runs its whole backward at I (a fused loss's backward runs once) and its
// W is empty.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <vector>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/pp/schedule.h"

namespace shardtrain::pp {

// What one stage computes. Its input is the previous stage's output (stage 0: what Pipeline::step's `input` gives).
class Stage {
 public:
  virtual ~Stage() = default;
  virtual at::Tensor forward(const at::Tensor& input, int microbatch) = 0;
  // The last stage only: the scalar loss of its output, its backward the microbatch's (scaled by the caller: 1 / M
  // makes the step's gradients the mean over microbatches).
  virtual at::Tensor loss(const at::Tensor& output, int microbatch) = 0;
  // Called before each of the stage's backward actions (B, I, W). `last`: the action computes the step's last
  // weight gradients of the stage, where a data-parallel stage reduces them across its replicas
  // (fsdp::set_requires_gradient_sync) after only accumulating them in the actions before. Default: nothing.
  virtual void before_backward(bool last) { (void)last; }
  // The last stage only: what its backward starts from (the loss's gradient) — float16's loss scale
  // (optim::GradScaler), the loss itself reported unscaled. Default 1.
  virtual double loss_scale() const { return 1; }
};

struct StepResult {
  double loss = 0;  // the sum of the microbatches' losses, on the rank holding the last stage; 0 on the others
  // Seconds this rank computed its stages' forwards and backwards; the rest of the step it waited for messages
  // (the bubble, and the transfers): 1 - busy / step is the measured bubble.
  double busy_seconds = 0;
};

class Pipeline {
 public:
  // `group`: the pipeline's ranks (group rank r runs the schedule's rank r); `stages`: this rank's, by stage index.
  // Throws std::invalid_argument when the group's size is not the schedule's ranks or `stages` is not exactly this
  // rank's stages.
  Pipeline(Schedule schedule, dist::Communicator group, std::map<int, Stage*> stages);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One step, this rank's actions in order. `input(m)`: stage 0's input of microbatch m (called on its rank only).
  StepResult step(const std::function<at::Tensor(int microbatch)>& input);
  // Forwards only, without gradients (evaluation): this rank's forward actions in the schedule's order (each
  // stage's in microbatch order, so no rank waits on a backward). Returns the last stage's forward output of every
  // microbatch, by microbatch, on the rank holding it (before Stage::loss: a loss undivided); empty elsewhere.
  std::vector<at::Tensor> forward_only(const std::function<at::Tensor(int microbatch)>& input);

  const Schedule& schedule() const { return schedule_; }

 private:
  // What a microbatch's forward left for its backward: the stage's input (a leaf requiring its gradient, past stage
  // 0), its output (the last stage's: the loss), and once I ran the output's gradient for W.
  struct InFlight {
    at::Tensor input, output, output_gradient;
  };
  // A stage boundary's activation: its sizes and dtype, sent once with the first message across it.
  struct Agreed {
    std::vector<int64_t> sizes;
    at::ScalarType dtype = at::kFloat;
  };

  at::Tensor take_activation(int stage, int microbatch);      // stage's input: received, or handed over
  void give_activation(int stage, int microbatch, const at::Tensor& output);
  at::Tensor take_gradient(int stage, int microbatch, const at::Tensor& like);
  void give_gradient(int stage, int microbatch, const at::Tensor& gradient);
  void forward(const Action& a, const std::function<at::Tensor(int)>& input, StepResult& result);
  void backward(const Action& a, StepResult& result);

  Schedule schedule_;
  dist::Communicator group_;
  std::map<int, Stage*> stages_;
  std::map<std::pair<int, int>, InFlight> in_flight_;             // by (stage, microbatch)
  std::map<std::pair<int, int>, at::Tensor> handed_activations_;  // to the next stage on this rank
  std::map<std::pair<int, int>, at::Tensor> handed_gradients_;    // to the previous stage on this rank
  std::map<int, Agreed> agreed_;                                  // by the stage sending across the boundary
  std::map<int, size_t> last_weight_action_;  // by stage: the index in this rank's list of its last weight gradients
  std::vector<dist::Work> sends_;                                 // waited at the end of the step
};

}  // namespace shardtrain::pp
