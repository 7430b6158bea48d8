#include "shardtrain/models/recipe.h"

#include <algorithm>
#include <stdexcept>

#include "util/closest_match.h"

namespace shardtrain::models {

std::map<std::string, double> Task::evaluate(torch::nn::Module&, const EvalInputs&) const {
  throw std::logic_error("task '" + name() + "' has no evaluation");
}

std::string Task::describe_progress(const std::map<std::string, double>&, const std::map<std::string, double>&) const {
  return "";
}

void Task::check_batch_size(int64_t, int64_t) const {}

void ModelRecipe::parallelize_hook(torch::nn::Module&, const dist::DeviceMesh&) const {}

ActivationBytes ModelRecipe::activation_bytes(const ActivationQuery&) const {
  throw std::invalid_argument("the activation memory of " + family() + " (" + flavor() +
                              ") is not modelled yet: its recipe states none (ModelRecipe::activation_bytes)");
}

std::unique_ptr<Task> ModelRecipe::task(const std::string& name) const {
  const std::vector<std::string> known = tasks();
  if (name.empty()) return make_task(known.front());
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    std::string list;
    for (const auto& t : known) list += (list.empty() ? "" : ", ") + t;
    throw std::invalid_argument("model.task: '" + name + "' is not a task of " + family() + " (did you mean '" +
                                util::closest_match(name, known) + "'? " + family() + " trains on: " + list + ")");
  }
  return make_task(name);
}

}  // namespace shardtrain::models
