#include "ckpt/tp_checkpoint.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <vector>

#include "shardtrain/io/files.h"

namespace shardtrain::ckpt {

namespace {

constexpr char kLayoutFile[] = "/tensor_parallel.json";

std::string slice_dir(const std::string& model_dir, int64_t rank, int64_t size) {
  return model_dir + "/tp-" + std::to_string(rank) + "-of-" + std::to_string(size);
}

struct SavedLayout {
  int64_t size = 1;
  std::map<std::string, tp::SplitLayout> split;
};

SavedLayout read_layout(const std::string& model_dir) {
  SavedLayout layout;
  const std::string path = model_dir + kLayoutFile;
  if (!io::path_exists(path)) return layout;
  try {
    const std::vector<char> bytes = io::read_file(path);
    const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end());
    layout.size = j.at("size").get<int64_t>();
    for (const auto& [name, split] : j.at("split").items()) {
      layout.split[name] = {split.at("dim").get<int64_t>(), split.at("sections").get<int64_t>(),
                            split.at("parts").get<int64_t>()};
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not a tensor-parallel layout (" + e.what() + ")");
  }
  if (layout.size < 1) throw std::runtime_error(path + ": size " + std::to_string(layout.size) + " is not 1 or more");
  return layout;
}

// How entry `name` ("<parameter>" or "<parameter>::<state>") is split, none for a whole one: a state follows its
// parameter when it has the parameter's rank (a moment), and is whole otherwise (a step count).
std::optional<tp::SplitLayout> entry_split(const std::map<std::string, tp::SplitLayout>& split,
                                           const std::string& name, const at::Tensor& value) {
  const size_t sep = name.find("::");
  auto it = split.find(name.substr(0, sep));
  if (it == split.end() || value.dim() <= it->second.dim) return std::nullopt;
  return it->second;
}

}  // namespace

int tp_size_of(const CheckpointModel& model) { return model.tp_group ? model.tp_group->size() : 1; }

std::string tp_state_dir(const std::string& model_dir, const CheckpointModel& model) {
  const int size = tp_size_of(model);
  return size > 1 ? slice_dir(model_dir, model.tp_group->rank(), size) : model_dir;
}

std::string tp_layout_json(const CheckpointModel& model) {
  nlohmann::json j;
  j["size"] = tp_size_of(model);
  j["split"] = nlohmann::json::object();
  for (const auto& [name, split] : model.tp_split) {
    j["split"][name] = {{"dim", split.dim}, {"sections", split.sections}, {"parts", split.parts}};
  }
  return j.dump(2);
}

std::map<std::string, at::Tensor> merged_model_state(const std::string& model_dir) {
  const SavedLayout layout = read_layout(model_dir);
  if (layout.size == 1) return fsdp::read_sharded_state_dict(model_dir);
  std::vector<std::map<std::string, at::Tensor>> slices;
  for (int64_t t = 0; t < layout.size; ++t) slices.push_back(fsdp::read_sharded_state_dict(slice_dir(model_dir, t, layout.size)));
  std::map<std::string, at::Tensor> whole;
  for (const auto& [name, first] : slices.front()) {
    const std::optional<tp::SplitLayout> split = entry_split(layout.split, name, first);
    if (!split) {
      whole[name] = first;
      continue;
    }
    std::vector<at::Tensor> parts;
    for (const auto& slice : slices) {
      auto it = slice.find(name);
      if (it == slice.end()) throw std::runtime_error(model_dir + ": a tensor-parallel slice lacks '" + name + "'");
      parts.push_back(it->second);
    }
    whole[name] = tp::merge_parts(parts, *split);
  }
  return whole;
}

void load_model_state(const std::string& model_dir, const CheckpointModel& model, const fsdp::ParamStates& states) {
  const SavedLayout layout = read_layout(model_dir);
  const int size = tp_size_of(model);
  if (layout.size == size && model.sharded) {
    fsdp::load_sharded_state_dict(model.root, tp_state_dir(model_dir, model), states);
    return;
  }
  // A replicated model (DDP's) takes its slices whole.
  std::map<std::string, at::Tensor> state = layout.size == size
                                                ? fsdp::read_sharded_state_dict(tp_state_dir(model_dir, model))
                                                : merged_model_state(model_dir);
  if (size > 1 && layout.size != size) {
    const int64_t rank = model.tp_group->rank();
    for (auto& [name, value] : state) {
      const std::optional<tp::SplitLayout> split = entry_split(model.tp_split, name, value);
      if (!split) continue;
      try {
        value = tp::slice_of(value, *split, rank, size);
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(model_dir + ": '" + name + "' does not split over " + std::to_string(size) +
                                 " tensor-parallel ranks (" + e.what() + ")");
      }
    }
  }
  fsdp::load_state_dict_rows(model.root, state, states);
}

}  // namespace shardtrain::ckpt
