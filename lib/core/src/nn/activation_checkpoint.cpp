#include "shardtrain/nn/activation_checkpoint.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "nn/autocast_guard.h"
#include "nn/saved_activation.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::nn {
namespace {

using torch::autograd::variable_list;

// The states of the default generators of the CPU and of some devices.
struct RngStates {
  std::vector<std::pair<at::Generator, at::Tensor>> saved;

  static RngStates capture(const std::vector<at::Device>& devices) {
    RngStates states;
    for (const at::Device& device : devices) {
      at::Generator gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      states.saved.emplace_back(gen, gen.get_state());
    }
    return states;
  }

  void restore() const {
    for (const auto& [gen, state] : saved) {
      at::Generator g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(state);
    }
  }
};

// Sets the generators to `replayed` for the life of the guard, then puts back what they were (also when the replay
// throws), so that the random stream after backward does not depend on checkpointing.
class RngReplay {
 public:
  explicit RngReplay(const RngStates* replayed) {
    if (!replayed) return;
    std::vector<at::Device> devices;
    for (const auto& entry : replayed->saved) devices.push_back(entry.first.device());
    current_ = RngStates::capture(devices);
    replayed->restore();
  }
  ~RngReplay() { current_.restore(); }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  RngStates current_;
};

// Autocast as the forward saw it, for the device types a replay may compute on.
struct AutocastStates {
  static constexpr c10::DeviceType kTypes[] = {c10::DeviceType::CPU, c10::DeviceType::CUDA};
  bool enabled[2] = {false, false};
  c10::ScalarType dtype[2] = {at::kBFloat16, at::kHalf};

  static AutocastStates capture() {
    AutocastStates s;
    for (int i = 0; i < 2; ++i) {
      s.enabled[i] = at::autocast::is_autocast_enabled(kTypes[i]);
      s.dtype[i] = at::autocast::get_autocast_dtype(kTypes[i]);
    }
    return s;
  }
};

bool differentiable(const at::Tensor& t) {
  return t.defined() && (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()));
}

// The backward of one checkpointed call. Its next edges are the call's tensor inputs, then the parameters that
// required a gradient; its inputs are the call's differentiable outputs.
class CheckpointBackward : public torch::autograd::Node {
 public:
  std::string name() const override { return "CheckpointBackward"; }

  variable_list apply(variable_list&& grads) override {
    if (released_) {
      throw std::runtime_error("activation checkpoint of " + label + ": backward ran through it a second time, but "
                               "its saved inputs were freed after the first (keep them with retain_graph)");
    }
    if (at::GradMode::is_enabled()) {
      throw std::runtime_error("activation checkpoint of " + label + ": higher-order gradients (create_graph) "
                               "through a checkpointed module are not supported");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].current_version() != inputs[i].saved_version()) {
        throw std::runtime_error("activation checkpoint of " + label + ": tensor input " + std::to_string(i) +
                                 " was modified in place after the forward (version " +
                                 std::to_string(inputs[i].saved_version()) + " -> " +
                                 std::to_string(inputs[i].current_version()) +
                                 "); the replay needs the value the forward saw");
      }
    }
    TensorVec replay_inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      replay_inputs.push_back(inputs[i].defined() ? inputs[i].get().detach().requires_grad_(input_requires_grad[i])
                                                  : at::Tensor());
    }
    TensorVec outputs;
    {
      RngReplay rng(preserve_rng ? &rng_states : nullptr);
      AutocastGuard cpu_autocast(AutocastStates::kTypes[0], autocast.enabled[0], autocast.dtype[0]);
      AutocastGuard cuda_autocast(AutocastStates::kTypes[1], autocast.enabled[1], autocast.dtype[1]);
      at::AutoGradMode grad_mode(true);
      outputs = replay(replay_inputs);
    }
    if (outputs.size() != output_slot.size()) {
      throw std::logic_error("activation checkpoint of " + label + ": the replay returned " +
                             std::to_string(outputs.size()) + " tensors, the forward " +
                             std::to_string(output_slot.size()));
    }
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int slot = output_slot[i];
      if (slot < 0 || !grads[slot].defined() || !outputs[i].requires_grad()) continue;
      roots.push_back(outputs[i]);
      root_grads.push_back(grads[slot]);
    }
    variable_list wrt;
    for (size_t i = 0; i < replay_inputs.size(); ++i) {
      if (input_requires_grad[i]) wrt.push_back(replay_inputs[i]);
    }
    wrt.insert(wrt.end(), params.begin(), params.end());
    variable_list result(inputs.size() + params.size());
    if (roots.empty() || wrt.empty()) return result;
    // Gradients only, no accumulation: parameter gradients go out through this node's edges to the outer
    // backward's accumulators (and their hooks), as without checkpointing.
    variable_list computed = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                                   /*create_graph=*/false, /*allow_unused=*/true);
    size_t k = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (input_requires_grad[i]) result[i] = std::move(computed[k++]);
    }
    for (size_t j = 0; j < params.size(); ++j) result[inputs.size() + j] = std::move(computed[k++]);
    return result;
  }

  void release_variables() override {
    replay = nullptr;
    inputs.clear();
    params.clear();
    rng_states = RngStates();
    released_ = true;
  }

  std::string label;
  Interceptor::Next replay;          // the rest of the chain and the body, replayable (nn/intercept.h)
  // The call's tensor inputs (undefined stay undefined): detached aliases, or host copies when the call is
  // activation-offloaded (nn/activation_offload.h)
  std::vector<SavedActivation> inputs;
  std::vector<bool> input_requires_grad;
  TensorVec params;                  // the module's parameters that required a gradient at the forward
  std::vector<int> output_slot;      // per output of the call: its input number on this node, -1 when none
  bool preserve_rng = true;
  RngStates rng_states;
  AutocastStates autocast;  // the replay computes in the precision the forward did

 private:
  bool released_ = false;
};

class CheckpointInterceptor : public Interceptor {
 public:
  CheckpointInterceptor(ActivationCheckpointOptions options, std::string label)
      : options_(options), label_(std::move(label)) {}

  TensorVec around(torch::nn::Module& module, TensorVec inputs, const Next& next) override {
    if (!at::GradMode::is_enabled()) return next(std::move(inputs));
    TensorVec params;
    for (const auto& p : module.parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    const bool input_requires_grad =
        std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
    if (params.empty() && !input_requires_grad) return next(std::move(inputs));

    auto node = std::shared_ptr<CheckpointBackward>(new CheckpointBackward(), torch::autograd::deleteNode);
    node->label = label_;
    node->preserve_rng = options_.preserve_rng_state;
    node->autocast = AutocastStates::capture();
    if (options_.preserve_rng_state) node->rng_states = RngStates::capture(devices_of(inputs, params));
    for (const at::Tensor& t : inputs) {
      node->inputs.push_back(SavedActivation::keep(t));
      node->input_requires_grad.push_back(t.defined() && t.requires_grad());
    }
    node->params = params;
    variable_list edge_sources = inputs;
    edge_sources.insert(edge_sources.end(), params.begin(), params.end());
    node->set_next_edges(torch::autograd::collect_next_edges(edge_sources));

    TensorVec outputs;
    {
      at::NoGradGuard no_grad;  // nothing inside is kept for backward
      outputs = next(std::move(inputs));
    }
    int slot = 0;
    for (at::Tensor& out : outputs) {
      if (!differentiable(out)) {
        node->output_slot.push_back(-1);
        continue;
      }
      out = out.detach();  // a tensor of its own: the output may alias an input or another output
      torch::autograd::create_gradient_edge(out, node);
      node->output_slot.push_back(slot++);
    }
    node->replay = next;
    return outputs;
  }

  std::string name() const override { return "activation_checkpoint"; }
  bool innermost() const override { return true; }

 private:
  // The CPU, and each other device among the tensors, once.
  static std::vector<at::Device> devices_of(const TensorVec& inputs, const TensorVec& params) {
    std::vector<at::Device> devices{at::Device(at::kCPU)};
    auto note = [&devices](const at::Tensor& t) {
      if (t.defined() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    };
    for (const auto& t : inputs) note(t);
    for (const auto& t : params) note(t);
    return devices;
  }

  ActivationCheckpointOptions options_;
  std::string label_;
};

const CheckpointInterceptor* checkpoint_of(torch::nn::Module& module) {
  return interceptor_of<const CheckpointInterceptor>(module);
}

}  // namespace

void apply_activation_checkpoint(torch::nn::Module& module, const ActivationCheckpointOptions& options,
                                 std::string label) {
  if (label.empty()) label = module.name();
  InterceptPoint* point = as_intercept_point(module);
  if (!point) {
    throw std::invalid_argument("apply_activation_checkpoint(" + label + "): class " + module.name() +
                                " does not derive from shardtrain::nn::Interceptable, so its calls cannot be "
                                "replayed; checkpoint a module that does (e.g. the transformer layer)");
  }
  if (checkpoint_of(module)) {
    throw std::invalid_argument("apply_activation_checkpoint(" + label + "): the module is checkpointed already");
  }
  point->interceptors().add(std::make_shared<CheckpointInterceptor>(options, std::move(label)));
}

bool is_activation_checkpointed(torch::nn::Module& module) { return checkpoint_of(module) != nullptr; }

bool remove_activation_checkpoint(torch::nn::Module& module) {
  const CheckpointInterceptor* c = checkpoint_of(module);
  return c && as_intercept_point(module)->interceptors().remove(c);
}

std::vector<std::string> apply_activation_checkpointing(
    const std::shared_ptr<torch::nn::Module>& root,
    const std::function<bool(const std::string& name, torch::nn::Module& module)>& select,
    const ActivationCheckpointOptions& options) {
  if (!root) throw std::invalid_argument("apply_activation_checkpointing: null module");
  std::vector<std::string> names;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> selected;  // (label, module)
  for (const auto& item : root->named_modules()) {
    if (!select(item.key(), *item.value())) continue;
    const std::string label = item.key().empty() ? item.value()->name() : item.key();
    if (!as_intercept_point(*item.value()) || checkpoint_of(*item.value())) {
      apply_activation_checkpoint(*item.value(), options, label);  // throws its error; nothing is checkpointed yet
    }
    names.push_back(item.key());
    selected.emplace_back(label, item.value());
  }
  for (const auto& [label, module] : selected) apply_activation_checkpoint(*module, options, label);
  return names;
}

}  // namespace shardtrain::nn
