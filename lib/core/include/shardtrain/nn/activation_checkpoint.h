// Activation checkpointing: a module's forward keeps only its inputs, not the activations inside it; backward runs
// the module's forward again — drawing the same random numbers, so dropout masks match — and differentiates that
// replay. Memory for activations drops from every intermediate of every checkpointed layer to one input per layer,
// for about one extra forward of compute (the FLAVA scaling post's largest lever beyond sharding).
//
//   nn::apply_activation_checkpoint(*layer);                      // one module
//   nn::apply_activation_checkpointing(model, [](const std::string&, torch::nn::Module& m) {   // by rule
//     return fsdp::module_class_name(m) == "FlavaLayer";
//   });
//
// It is an interceptor (nn/intercept.h), so the module's class must derive from nn::Interceptable. It always sits
// inside the module's other interceptors: on a fully_shard unit the replay runs while the unit is gathered for its
// backward, and gathers nothing itself. Parameter gradients leave the replay through the outer backward's own
// gradient accumulators, so fully_shard's and replicate's per-parameter hooks run as without checkpointing.
//
// Limits: higher-order gradients (create_graph) through a checkpointed module are an error; an input modified in
// place between forward and backward is an error naming the module; forward without grad mode runs plainly.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace shardtrain::nn {

struct ActivationCheckpointOptions {
  // The replay draws the random numbers the forward drew, on the CPU and on each device the inputs and parameters
  // live on (torch.utils.checkpoint's preserve_rng_state); the random stream after backward is as without
  // checkpointing. Off: the states are not saved, and dropout differs between forward and replay.
  bool preserve_rng_state = true;
};

// Checkpoints `module`; `label` names it in errors (default: its class name). Throws std::invalid_argument when its
// class does not derive from nn::Interceptable or when it is checkpointed already.
void apply_activation_checkpoint(torch::nn::Module& module, const ActivationCheckpointOptions& options = {},
                                 std::string label = "");

bool is_activation_checkpointed(torch::nn::Module& module);

// Stops checkpointing `module`; false when it was not checkpointed.
bool remove_activation_checkpoint(torch::nn::Module& module);

// Checkpoints every module of `root` (root itself included, name "") that `select` picks given its qualified name;
// returns their names in named_modules() order. Throws std::invalid_argument naming the first selected module that
// cannot be checkpointed.
std::vector<std::string> apply_activation_checkpointing(
    const std::shared_ptr<torch::nn::Module>& root,
    const std::function<bool(const std::string& name, torch::nn::Module& module)>& select,
    const ActivationCheckpointOptions& options = {});

}  // namespace shardtrain::nn
