#include "shardtrain/fsdp/wrap_policy.h"

#include <set>
#include <stdexcept>

#include "shardtrain/nn/intercept.h"

namespace shardtrain::fsdp {

namespace {

// TORCH_MODULE(Name) wraps NameImpl: both spellings name the same layer.
std::string without_impl_suffix(std::string name) {
  const std::string suffix = "Impl";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    name.resize(name.size() - suffix.size());
  }
  return name;
}

}  // namespace

std::string module_class_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  return without_impl_suffix(std::move(name));
}

WrapPolicy wrap_by_class_name(std::vector<std::string> class_names) {
  for (auto& n : class_names) n = without_impl_suffix(std::move(n));
  std::set<std::string> names(class_names.begin(), class_names.end());
  return WrapPolicy{[names](const std::string&, torch::nn::Module& m, int64_t) {
                      return names.count(module_class_name(m)) > 0;
                    },
                    class_names};
}

WrapPolicy wrap_by_size(int64_t min_num_params) {
  if (min_num_params < 1) {
    throw std::invalid_argument("wrap_by_size: min_num_params = " + std::to_string(min_num_params) + ", expected >= 1");
  }
  return WrapPolicy{[min_num_params](const std::string&, torch::nn::Module& m, int64_t unwrapped) {
                      return unwrapped >= min_num_params && nn::as_intercept_point(m) != nullptr;
                    },
                    {}};
}

WrapPolicy wrap_if(std::function<bool(const std::string& name, torch::nn::Module& module)> predicate) {
  return WrapPolicy{[predicate = std::move(predicate)](const std::string& name, torch::nn::Module& m, int64_t) {
                      return predicate(name, m);
                    },
                    {}};
}

WrapPolicy any_of(std::vector<WrapPolicy> policies) {
  WrapPolicy combined;
  for (const auto& p : policies) {
    combined.required_class_names.insert(combined.required_class_names.end(), p.required_class_names.begin(),
                                         p.required_class_names.end());
  }
  combined.select = [policies = std::move(policies)](const std::string& name, torch::nn::Module& m, int64_t n) {
    for (const auto& p : policies) {
      if (p.select(name, m, n)) return true;
    }
    return false;
  };
  return combined;
}

namespace {

// Post-order walk: children first, each module's count of parameters not taken by a unit below it. Returns that
// count for `module`'s subtree after wrapping below it. Parameters shared between modules count once.
int64_t wrap_below(const std::string& name, const std::shared_ptr<torch::nn::Module>& module, const WrapPolicy& policy,
                   std::set<const c10::TensorImpl*>& seen, std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& selected) {
  int64_t unwrapped = 0;
  for (const auto& p : module->named_parameters(/*recurse=*/false)) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) unwrapped += p.value().numel();
  }
  for (const auto& child : module->named_children()) {
    const std::string child_name = name.empty() ? child.key() : name + "." + child.key();
    const int64_t below = wrap_below(child_name, child.value(), policy, seen, selected);
    if (policy.select(child_name, *child.value(), below)) {
      selected.emplace_back(child_name, child.value());
    } else {
      unwrapped += below;
    }
  }
  return unwrapped;
}

}  // namespace

std::vector<FsdpUnit> fully_shard_model(const std::shared_ptr<torch::nn::Module>& root, const dist::Communicator& group,
                                        const WrapPolicy& policy, const FsdpOptions& options,
                                        const std::optional<FsdpOptions>& root_options) {
  if (!policy.select) throw std::invalid_argument("fully_shard_model: the wrap policy has no select function");
  std::set<const c10::TensorImpl*> seen;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> selected;
  wrap_below("", root, policy, seen, selected);
  for (const std::string& required : policy.required_class_names) {
    bool found = false;
    for (const auto& [name, m] : selected) found = found || module_class_name(*m) == required;
    if (!found) {
      throw std::invalid_argument("fully_shard_model: no module of class '" + required + "' in " +
                                  module_class_name(*root) + " to wrap (check the transformer layer class name)");
    }
  }
  for (const auto& [name, m] : selected) {
    if (nn::as_intercept_point(*m) == nullptr) {
      throw std::invalid_argument("fully_shard_model: the policy selected '" + name + "' (" + m->name() +
                                  "), which does not derive from shardtrain::nn::Interceptable and cannot be a unit");
    }
  }
  std::vector<FsdpUnit> units;
  for (const auto& [name, m] : selected) units.push_back(fully_shard(m, group, options));
  units.push_back(fully_shard(root, group, root_options.value_or(options)));
  return units;
}

}  // namespace shardtrain::fsdp
