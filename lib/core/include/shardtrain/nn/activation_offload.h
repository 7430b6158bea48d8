// Activation offloading: what a module's calls save for backward moves to host memory as forward saves it and comes
// back as backward reaches the call, the call before it brought back too (prefetched one call ahead, as
// Megatron-Core's fine-grained activation offloading; torch.autograd.graph.save_on_cpu without the prefetch).
// The device then holds the activations of the call computing and the next one down, not of every layer; the
// host holds the rest. Numerics are unchanged: the copies are exact.
//
//   nn::apply_activation_offloading(model, [](const std::string&, torch::nn::Module& m) {
//     return fsdp::module_class_name(m) == "LlamaDecoderLayer";
//   });
//
// What moves: every tensor autograd saves inside the call (through LibTorch's saved-variable hooks), whole storages
// once each, so views of one storage (attention's q, k and v) cost one copy; with activation checkpointing the
// checkpointed call's inputs, which are all it keeps. What stays: parameters, views and casts of them (they live on
// the device anyway; autocast's casts are made again in the replay), tensors without a strided storage.
//
// On a GPU the host copies are pinned and the copies run on a side stream, overlapping compute: forward's start where
// the tensor was saved, backward's as the call after is reached, and compute waits for one only where it uses it.
// On the CPU the host copies are filed in the counting allocator's HOST tier (memory/memory_stats.h), so the compute
// tier's peak falls by what moved and the host tier's rises by it, as a GPU's and its host's would.
//
// It is an interceptor (nn/intercept.h): the module's class must derive from nn::Interceptable. Added after
// fully_shard or replicate it sits inside them (their gathers and broadcasts are not saved tensors); checkpointing
// stays innermost. A call's replay under checkpointing is not offloaded (backward needs it at once).
//
// Process-wide once used: LibTorch asks its default autograd engine for saved-variable hooks, so the first
// application installs an engine that answers while an offloaded call is running on the asking thread (and nothing
// otherwise). A process whose Python bindings installed their own engine cannot offload (an error says so).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace shardtrain::nn {

// Offloads what the calls of every module of `root` (root itself included, name "") that `select` picks save for
// backward; the selected modules share one schedule (a call's predecessor in forward is prefetched with it in
// backward). Returns their names in named_modules() order. Throws std::invalid_argument naming the first selected
// module whose class does not derive from nn::Interceptable or that offloads already (nothing is applied then),
// std::runtime_error when the autograd engine is not LibTorch's own.
std::vector<std::string> apply_activation_offloading(
    const std::shared_ptr<torch::nn::Module>& root,
    const std::function<bool(const std::string& name, torch::nn::Module& module)>& select);

bool is_activation_offloaded(torch::nn::Module& module);

// Stops offloading `module`'s calls; false when they were not offloaded.
bool remove_activation_offload(torch::nn::Module& module);

}  // namespace shardtrain::nn
