// Which modules of a model become fully_shard units: the auto-wrap policies of PyTorch FSDP and Accelerate.
//
//   auto units = fsdp::fully_shard_model(model.ptr(), mesh.world(), fsdp::wrap_by_class_name({"TransformerLayer"}));
//
// shards every TransformerLayer (innermost first), then the root, which takes the parameters no unit owns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/fsdp/fully_shard.h"

namespace shardtrain::fsdp {

struct WrapPolicy {
  // Asked for every module below the root, children before parents, with its qualified name ("blocks.3") and the
  // number of parameters in its subtree not yet owned by a unit.
  std::function<bool(const std::string& name, torch::nn::Module& module, int64_t unwrapped_params)> select;
  // Class names the policy was given: each must match some module, else the model is not what the caller thinks
  // (Accelerate: "Could not find the transformer layer class to wrap in the model").
  std::vector<std::string> required_class_names;
};

// The transformer-layer policy of the seeds and Accelerate's fsdp_transformer_layer_cls_to_wrap: modules whose
// class is one of `class_names`. A name matches the class's unqualified name with or without TORCH_MODULE's "Impl"
// suffix: "BertLayer" matches shardtrain::models::BertLayerImpl.
WrapPolicy wrap_by_class_name(std::vector<std::string> class_names);

// Modules of the given C++ types (their Impl classes).
template <class... Modules>
WrapPolicy wrap_by_type() {
  return WrapPolicy{[](const std::string&, torch::nn::Module& m, int64_t) {
                      return ((dynamic_cast<Modules*>(&m) != nullptr) || ...);
                    },
                    {}};
}

// FSDP's size_based_auto_wrap_policy: a module whose not-yet-wrapped parameters number at least min_num_params.
// Modules that cannot be intercepted (plain torch::nn layers) are passed over; their parameters go to a parent.
WrapPolicy wrap_by_size(int64_t min_num_params);

// Any rule over the qualified name and the module.
WrapPolicy wrap_if(std::function<bool(const std::string& name, torch::nn::Module& module)> predicate);

// Selects what any of `policies` selects.
WrapPolicy any_of(std::vector<WrapPolicy> policies);

// The name WrapPolicy class-name matching uses: unqualified, without a trailing "Impl".
std::string module_class_name(const torch::nn::Module& module);

// fully_shard on every module `policy` selects, innermost first, with `options`; then on `root` with
// `root_options` (defaults to `options`). Returns the units, root last. Throws std::invalid_argument naming the
// module when a selected module does not derive from nn::Interceptable, and naming the class when a required class
// name matched nothing.
std::vector<FsdpUnit> fully_shard_model(const std::shared_ptr<torch::nn::Module>& root, const dist::Communicator& group,
                                        const WrapPolicy& policy, const FsdpOptions& options = {},
                                        const std::optional<FsdpOptions>& root_options = std::nullopt);

}  // namespace shardtrain::fsdp
