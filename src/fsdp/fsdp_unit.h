// One unit of fully_shard: the communication group of a module's parameters, its state machine and its place in
// the module's call (private to the fsdp layer).
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <vector>

#include "fsdp/fsdp_param.h"
#include "shardtrain/dist/communicator.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::fsdp {

// Where a unit is in the step. Transitions are checked; a violation is an error naming the unit.
enum class TrainingState {
  IDLE,           // between steps, or forward done
  FORWARD,        // inside the unit's forward
  PRE_BACKWARD,   // gathered for backward, waiting for its gradients
  POST_BACKWARD,  // gradients reduce-scattered (in flight), waiting for the end of backward
};

struct FsdpUnit::Impl : std::enable_shared_from_this<FsdpUnit::Impl> {
  Impl(std::string module_name, std::vector<std::pair<std::string, at::Tensor>> params, dist::Communicator group,
       FsdpOptions options);

  void unshard();
  void reshard();

  // Hooks of the autograd pass.
  void on_output_gradient();         // the unit's outputs got their gradient: gather for backward
  void on_parameter_gradient(size_t index);  // AccumulateGrad of parameter `index` ran
  void reduce_scatter_gradients();   // all gradients present (or backward ended): start the reduce-scatter
  void finish_backward();            // end of backward: wait, install the sharded gradients

  std::string module_name;
  dist::Communicator group;
  FsdpOptions options;
  std::vector<FsdpParam> params;
  std::vector<int64_t> offsets;  // each param's offset inside the unit's per-rank shard block
  int64_t unit_shard_numel = 0;  // elements of this rank's shard block
  at::Tensor sharded_flat;       // (unit_shard_numel): the shards the optimizer updates
  std::vector<at::Tensor> stashed_grads;  // the sharded .grad of each param while it is unsharded
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators;  // kept alive: tensors hold them weakly
  ShardState state = ShardState::SHARDED;
  TrainingState training = TrainingState::IDLE;
  size_t gradients_ready = 0;
  bool backward_callback_queued = false;
  at::Tensor rs_output;  // (unit_shard_numel) reduced gradient shards, valid after rs_work.wait()
  dist::Work rs_work;
};

// The interceptor placed on the unit's module.
class FsdpInterceptor : public nn::Interceptor {
 public:
  explicit FsdpInterceptor(std::shared_ptr<FsdpUnit::Impl> unit) : unit_(std::move(unit)) {}
  nn::TensorVec around(torch::nn::Module& module, nn::TensorVec inputs, const Next& next) override;
  std::string name() const override { return "fully_shard"; }
  const std::shared_ptr<FsdpUnit::Impl>& unit() const { return unit_; }

 private:
  std::shared_ptr<FsdpUnit::Impl> unit_;
};

}  // namespace shardtrain::fsdp
