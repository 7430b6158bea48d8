#include "shardtrain/optim/optimizer_state.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/anyprecision_adamw.h"
#include "shardtrain/optim/disk_adamw.h"

namespace shardtrain::optim {
namespace {

[[noreturn]] void unknown_state() {
  throw std::invalid_argument(
      "optimizer state: only AdamW (on the device, the host or a disk), AnyPrecisionAdamW, Adafactor and SGD states can "
      "be checkpointed");
}

}  // namespace

int64_t state_step(const torch::optim::OptimizerParamState& state) {
  if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) return s->step();
  if (auto* s = dynamic_cast<const AnyPrecisionAdamWParamState*>(&state)) return s->step();
  if (auto* s = dynamic_cast<const AdafactorParamState*>(&state)) return s->step();
  if (dynamic_cast<const torch::optim::SGDParamState*>(&state)) return 1;  // SGD counts no steps: 1 = has state
  unknown_state();
}

std::map<std::string, StateTensor> state_tensors(const torch::optim::OptimizerParamState& state,
                                                 const at::Tensor& param) {
  if (auto* s = dynamic_cast<const DiskAdamWParamState*>(&state)) {  // read from disk (or still waiting to go there)
    std::map<std::string, StateTensor> out;
    for (auto& [name, tensor] : s->owner->read_state(param)) out.emplace(name, StateTensor{std::move(tensor)});
    return out;
  }
  if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return {{"exp_avg", {s->exp_avg()}}, {"exp_avg_sq", {s->exp_avg_sq()}}};
  }
  if (auto* s = dynamic_cast<const AnyPrecisionAdamWParamState*>(&state)) {
    std::map<std::string, StateTensor> out{{"exp_avg", {s->exp_avg()}}, {"exp_avg_sq", {s->exp_avg_sq()}}};
    if (s->compensation().defined()) out.emplace("compensation", StateTensor{s->compensation()});
    return out;
  }
  if (auto* s = dynamic_cast<const AdafactorParamState*>(&state)) {
    std::map<std::string, StateTensor> out;
    if (s->exp_avg().defined()) out.emplace("exp_avg", StateTensor{s->exp_avg()});
    if (s->exp_avg_sq().defined()) out.emplace("exp_avg_sq", StateTensor{s->exp_avg_sq()});
    if (s->exp_avg_sq_row().defined()) {
      out.emplace("exp_avg_sq_row", StateTensor{s->exp_avg_sq_row(), StateSplit::BY_ROWS});
      const bool whole = Adafactor::column_statistics_are_whole(param);
      out.emplace("exp_avg_sq_col",
                  StateTensor{s->exp_avg_sq_col(), whole ? StateSplit::WHOLE : StateSplit::BY_ROWS});
    }
    return out;
  }
  if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    return {{"momentum_buffer", {s->momentum_buffer()}}};
  }
  unknown_state();
}

std::map<std::string, StateTensor> install_empty_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                                                       int64_t step) {
  if (auto* any = dynamic_cast<AnyPrecisionAdamW*>(&optimizer)) {
    return state_tensors(any->empty_state(param, step), param);
  }
  if (auto* adafactor = dynamic_cast<Adafactor*>(&optimizer)) {
    return state_tensors(adafactor->empty_state(param, step), param);
  }
  if (auto* disk = dynamic_cast<DiskAdamW*>(&optimizer)) {
    std::map<std::string, StateTensor> out;
    for (auto& [name, tensor] : disk->empty_state(param, step)) out.emplace(name, StateTensor{std::move(tensor)});
    return out;
  }
  if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(at::zeros_like(param, at::MemoryFormat::Contiguous));
    auto tensors = state_tensors(*s, param);
    optimizer.state()[param.unsafeGetTensorImpl()] = std::move(s);
    return tensors;
  }
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) == nullptr) unknown_state();
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(step);
  s->exp_avg(at::zeros_like(param, at::MemoryFormat::Contiguous));
  s->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Contiguous));
  auto tensors = state_tensors(*s, param);
  optimizer.state()[param.unsafeGetTensorImpl()] = std::move(s);
  return tensors;
}

}  // namespace shardtrain::optim
