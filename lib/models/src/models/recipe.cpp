#include "shardtrain/models/recipe.h"

#include <algorithm>
#include <stdexcept>

#include "shardtrain/models/generation.h"
#include "shardtrain/util/closest_match.h"

namespace shardtrain::models {

std::map<std::string, double> Task::evaluate(torch::nn::Module&, const EvalInputs&) const {
  throw std::logic_error("task '" + name() + "' has no evaluation");
}

std::string Task::describe_progress(const std::map<std::string, double>&, const std::map<std::string, double>&) const {
  return "";
}

void Task::check_batch_size(int64_t, int64_t) const {}

void ModelRecipe::parallelize_hook(torch::nn::Module&, const dist::DeviceMesh&) const {}

std::string ModelRecipe::pipeline_stages_refused() const {
  return "the " + family() + " family's pipeline stages are not written yet (Llama, Mistral, Qwen2 and Qwen3 with "
         "a head of their own have them)";
}

std::vector<std::string> ModelRecipe::own_unit_classes() const {
  std::vector<std::string> classes = extra_unit_classes();
  const EdgeUnits edges = edge_unit_classes();
  for (const std::string* c : {&edges.input, &edges.output}) {
    if (!c->empty()) classes.push_back(*c);
  }
  return classes;
}

ActivationBytes ModelRecipe::activation_bytes(const ActivationQuery&) const {
  throw std::invalid_argument("the activation memory of " + family() + " (" + flavor() +
                              ") is not modelled yet: its recipe states none (ModelRecipe::activation_bytes)");
}

std::unique_ptr<TextDecoder> ModelRecipe::text_decoder(torch::nn::Module&) const {
  throw std::invalid_argument(family() + " (" + flavor() + ") does not generate text: generation is for the causal "
                              "language models (llama, mistral, qwen2, qwen3, gpt2) and t5");
}

namespace {

// Throws std::invalid_argument naming `name` and the recipe's tasks when it is not one of them.
void check_task_name(const ModelRecipe& recipe, const std::string& name) {
  const std::vector<std::string> known = recipe.tasks();
  if (std::find(known.begin(), known.end(), name) != known.end()) return;
  std::string list;
  for (const auto& t : known) list += (list.empty() ? "" : ", ") + t;
  throw std::invalid_argument("model.task: '" + name + "' is not a task of " + recipe.family() + " (did you mean '" +
                              util::closest_match(name, known) + "'? " + recipe.family() + " trains on: " + list + ")");
}

}  // namespace

std::unique_ptr<Task> ModelRecipe::task(const std::string& name) const {
  if (name.empty()) return make_task(tasks().front());
  check_task_name(*this, name);
  return make_task(name);
}

std::shared_ptr<const ModelRecipe> ModelRecipe::with_task_head(const std::string&, const TaskSetup&) const {
  return nullptr;
}

std::shared_ptr<const ModelRecipe> recipe_for_task(std::shared_ptr<const ModelRecipe> recipe, const std::string& task,
                                                   const TaskSetup& setup) {
  if (!task.empty()) check_task_name(*recipe, task);
  auto headed = recipe->with_task_head(task.empty() ? recipe->tasks().front() : task, setup);
  return headed ? headed : recipe;
}

}  // namespace shardtrain::models
