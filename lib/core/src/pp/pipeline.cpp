#include "shardtrain/pp/pipeline.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace shardtrain::pp {
namespace {

// Messages' tags: what (the boundary's shape, an activation, a gradient), the stage sending across the boundary
// (the gradient's: the stage receiving it) and the microbatch, each in bits of its own.
enum class Message { SHAPE = 0, ACTIVATION = 1, GRADIENT = 2 };
constexpr int kStageBits = 11, kMicrobatchBits = 16;

int tag_of(Message what, int stage, int microbatch) {
  return (static_cast<int>(what) << (kStageBits + kMicrobatchBits)) | (stage << kMicrobatchBits) | microbatch;
}

// A shape message: rank, dtype, then the sizes (at most kMaxRank).
constexpr int64_t kMaxRank = 8;

// Adds the seconds `compute` takes to `busy`.
template <class F>
auto timed(double& busy, F&& compute) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Add {
    double& busy;
    std::chrono::steady_clock::time_point t0;
    ~Add() { busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } add{busy, t0};
  return compute();
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

}  // namespace

Pipeline::Pipeline(Schedule schedule, dist::Communicator group, std::map<int, Stage*> stages)
    : schedule_(std::move(schedule)), group_(std::move(group)), stages_(std::move(stages)) {
  const ScheduleShape& shape = schedule_.shape;
  if (group_.size() != shape.ranks) {
    throw std::invalid_argument("pipeline: the group has " + std::to_string(group_.size()) + " ranks, the schedule " +
                                std::to_string(shape.ranks));
  }
  if (shape.stages() > (1 << kStageBits) || shape.microbatches > (1 << kMicrobatchBits)) {
    throw std::invalid_argument("pipeline: at most " + std::to_string(1 << kStageBits) + " stages and " +
                                std::to_string(1 << kMicrobatchBits) + " microbatches");
  }
  for (int s = 0; s < shape.stages(); ++s) {
    const bool mine = shape.rank_of(s) == group_.rank();
    if (mine != (stages_.count(s) == 1) || (mine && stages_.at(s) == nullptr)) {
      throw std::invalid_argument("pipeline: rank " + std::to_string(group_.rank()) +
                                  (mine ? " holds" : " does not hold") + " stage " + std::to_string(s) + " of " +
                                  std::to_string(shape.stages()) +
                                  (mine ? ", and was not given it" : ", and was given it"));
    }
  }
  // A stage's weight gradients come from B, or with the input's gradient split from them from W — except on the last
  // stage, whose I runs the whole backward.
  const std::vector<Action>& actions = schedule_.actions.at(static_cast<size_t>(group_.rank()));
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const bool last = a.stage + 1 == shape.stages();
    if (a.op == Op::BACKWARD || (a.op == Op::BACKWARD_INPUT && last) || (a.op == Op::BACKWARD_WEIGHT && !last)) {
      last_weight_action_[a.stage] = i;
    }
  }
}

Pipeline::~Pipeline() = default;

at::Tensor Pipeline::take_activation(int stage, int microbatch) {
  const int from = schedule_.shape.rank_of(stage - 1);
  if (from == group_.rank()) {
    auto node = handed_activations_.extract({stage - 1, microbatch});
    if (node.empty()) throw std::logic_error("pipeline: stage " + std::to_string(stage) + "'s input is missing");
    return node.mapped();
  }
  auto agreed = agreed_.find(stage - 1);
  if (agreed == agreed_.end()) {
    at::Tensor header = at::empty({2 + kMaxRank}, at::TensorOptions().dtype(at::kLong).device(group_.device()));
    group_.recv(header, from, tag_of(Message::SHAPE, stage - 1, 0)).wait();
    const at::Tensor h = header.cpu();
    Agreed a;
    a.dtype = static_cast<at::ScalarType>(h[1].item<int64_t>());
    for (int64_t i = 0; i < h[0].item<int64_t>(); ++i) a.sizes.push_back(h[2 + i].item<int64_t>());
    agreed = agreed_.emplace(stage - 1, std::move(a)).first;
  }
  at::Tensor received = at::empty(agreed->second.sizes,
                                  at::TensorOptions().dtype(agreed->second.dtype).device(group_.device()));
  group_.recv(received, from, tag_of(Message::ACTIVATION, stage - 1, microbatch)).wait();
  return received;
}

void Pipeline::give_activation(int stage, int microbatch, const at::Tensor& output) {
  const int to = schedule_.shape.rank_of(stage + 1);
  at::Tensor value = output.detach();
  if (to == group_.rank()) {
    handed_activations_[{stage, microbatch}] = value;
    return;
  }
  value = value.contiguous();
  const std::vector<int64_t> sizes = value.sizes().vec();
  auto agreed = agreed_.find(stage);
  if (agreed == agreed_.end()) {
    if (static_cast<int64_t>(sizes.size()) > kMaxRank) {
      throw std::invalid_argument("pipeline: stage " + std::to_string(stage) + "'s output has " +
                                  std::to_string(sizes.size()) + " dimensions, at most " + std::to_string(kMaxRank));
    }
    at::Tensor header = at::zeros({2 + kMaxRank}, at::kLong);
    header[0] = static_cast<int64_t>(sizes.size()), header[1] = static_cast<int64_t>(value.scalar_type());
    for (size_t i = 0; i < sizes.size(); ++i) header[2 + static_cast<int64_t>(i)] = sizes[i];
    sends_.push_back(group_.send(header.to(group_.device()), to, tag_of(Message::SHAPE, stage, 0)));
    agreed = agreed_.emplace(stage, Agreed{sizes, value.scalar_type()}).first;
  } else if (agreed->second.sizes != sizes || agreed->second.dtype != value.scalar_type()) {
    throw std::invalid_argument("pipeline: stage " + std::to_string(stage) + "'s output is " + sizes_text(sizes) +
                                " " + c10::toString(value.scalar_type()) + ", the shape its boundary agreed at the "
                                "first message is " + sizes_text(agreed->second.sizes) + " " +
                                c10::toString(agreed->second.dtype) +
                                " (pipelines keep one activation shape: pad every batch to one length)");
  }
  sends_.push_back(group_.send(value, to, tag_of(Message::ACTIVATION, stage, microbatch)));
}

at::Tensor Pipeline::take_gradient(int stage, int microbatch, const at::Tensor& like) {
  const int from = schedule_.shape.rank_of(stage + 1);
  if (from == group_.rank()) {
    auto node = handed_gradients_.extract({stage, microbatch});
    if (node.empty()) {
      throw std::logic_error("pipeline: stage " + std::to_string(stage) + "'s output gradient is missing");
    }
    return node.mapped();
  }
  at::Tensor received = at::empty(like.sizes(), like.options().device(group_.device()));
  group_.recv(received, from, tag_of(Message::GRADIENT, stage, microbatch)).wait();
  return received;
}

void Pipeline::give_gradient(int stage, int microbatch, const at::Tensor& gradient) {
  const int to = schedule_.shape.rank_of(stage - 1);
  if (to == group_.rank()) {
    handed_gradients_[{stage - 1, microbatch}] = gradient;
    return;
  }
  sends_.push_back(group_.send(gradient.contiguous(), to, tag_of(Message::GRADIENT, stage - 1, microbatch)));
}

void Pipeline::forward(const Action& a, const std::function<at::Tensor(int)>& input, StepResult& result) {
  Stage& stage = *stages_.at(a.stage);
  InFlight f;
  f.input = a.stage == 0 ? input(a.microbatch) : take_activation(a.stage, a.microbatch).requires_grad_(true);
  const bool last = a.stage + 1 == schedule_.shape.stages();
  f.output = timed(result.busy_seconds, [&] {
    at::Tensor out = stage.forward(f.input, a.microbatch);
    return last ? stage.loss(out, a.microbatch) : out;
  });
  if (last) {
    result.loss += f.output.item<double>();
  } else {
    give_activation(a.stage, a.microbatch, f.output);
  }
  in_flight_[{a.stage, a.microbatch}] = std::move(f);
}

void Pipeline::backward(const Action& a, StepResult& result) {
  const auto key = std::make_pair(a.stage, a.microbatch);
  auto it = in_flight_.find(key);
  if (it == in_flight_.end()) throw std::logic_error("pipeline: " + to_string(a) + " before its forward");
  InFlight& f = it->second;
  const bool last = a.stage + 1 == schedule_.shape.stages(), first = a.stage == 0;
  if (a.op != Op::BACKWARD_WEIGHT) {
    f.output_gradient = last ? at::full_like(f.output, stages_.at(a.stage)->loss_scale())
                             : take_gradient(a.stage, a.microbatch, f.output);
  }
  auto whole_backward = [&] {
    timed(result.busy_seconds, [&] { torch::autograd::backward({f.output}, {f.output_gradient}); });
  };
  switch (a.op) {
    case Op::BACKWARD:
      whole_backward();
      if (!first) give_gradient(a.stage, a.microbatch, f.input.grad());
      in_flight_.erase(it);
      return;
    case Op::BACKWARD_INPUT:
      if (last) {  // the whole backward now (the loss's fused kernels run backward once); its W has nothing left
        whole_backward();
        if (!first) give_gradient(a.stage, a.microbatch, f.input.grad());
        f.output = at::Tensor();
      } else if (!first) {  // stage 0 has no input gradient to send: its W runs the whole backward
        give_gradient(a.stage, a.microbatch, timed(result.busy_seconds, [&] {
                        return torch::autograd::grad({f.output}, {f.input}, {f.output_gradient},
                                                     /*retain_graph=*/true)[0];
                      }));
      }
      return;
    case Op::BACKWARD_WEIGHT:
      if (f.output.defined()) whole_backward();
      in_flight_.erase(it);
      return;
    case Op::FORWARD:
      break;
  }
}

StepResult Pipeline::step(const std::function<at::Tensor(int)>& input) {
  StepResult result;
  const std::vector<Action>& actions = schedule_.actions.at(static_cast<size_t>(group_.rank()));
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.op == Op::FORWARD) {
      forward(a, input, result);
    } else {
      stages_.at(a.stage)->before_backward(last_weight_action_.at(a.stage) == i);
      backward(a, result);
    }
  }
  dist::wait_all(sends_);
  sends_.clear();
  if (!in_flight_.empty() || !handed_activations_.empty() || !handed_gradients_.empty()) {
    throw std::logic_error("pipeline: the step ended with microbatches whose backward did not run");
  }
  return result;
}

std::vector<at::Tensor> Pipeline::forward_only(const std::function<at::Tensor(int)>& input) {
  const at::NoGradGuard no_grad;
  const int stages = schedule_.shape.stages();
  std::vector<at::Tensor> outputs;
  for (const Action& a : schedule_.actions.at(static_cast<size_t>(group_.rank()))) {
    if (a.op != Op::FORWARD) continue;
    const at::Tensor in = a.stage == 0 ? input(a.microbatch) : take_activation(a.stage, a.microbatch);
    at::Tensor out = stages_.at(a.stage)->forward(in, a.microbatch);
    if (a.stage + 1 < stages) {
      give_activation(a.stage, a.microbatch, out);
      continue;
    }
    if (outputs.empty()) outputs.resize(static_cast<size_t>(schedule_.shape.microbatches));
    outputs[static_cast<size_t>(a.microbatch)] = std::move(out);
  }
  dist::wait_all(sends_);
  sends_.clear();
  return outputs;
}

}  // namespace shardtrain::pp
