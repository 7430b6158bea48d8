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

// How a state tensor of a parameter split as `param` (a tensor of `param_dims` dimensions) is split itself: a
// moment like the parameter; Adafactor's row statistics (BY_ROWS) with the parameter's rows, whole when the
// columns are split (every rank's equal); its column statistics of a matrix (WHOLE over FSDP's shards) with the
// columns, whole when the rows are split.
std::optional<tp::SplitLayout> state_split(const tp::SplitLayout& param, optim::StateSplit split, int64_t param_dims) {
  switch (split) {
    case optim::StateSplit::LIKE_PARAMETER: return param;
    case optim::StateSplit::BY_ROWS: return param.dim == 0 ? std::optional<tp::SplitLayout>(param) : std::nullopt;
    case optim::StateSplit::WHOLE:
      if (param_dims == 2 && param.dim == 1) return tp::SplitLayout{0, param.sections, param.parts};
      return std::nullopt;
  }
  return std::nullopt;
}

// How every split entry of `model` is split: its parameters ("<parameter>") and their states
// ("<parameter>::<key>"). An entry not listed is whole on every rank of the group.
std::map<std::string, tp::SplitLayout> entry_splits(const CheckpointModel& model, const fsdp::ParamStates& states) {
  std::map<std::string, tp::SplitLayout> out = model.tp_split;
  std::map<std::string, int64_t> dims;
  for (const auto& p : model.root->named_parameters()) dims[p.key()] = p.value().dim();
  for (const auto& [key, tensors] : states) {
    for (const auto& [name, state] : tensors) {
      auto it = model.tp_split.find(name);
      if (it == model.tp_split.end()) continue;
      if (auto split = state_split(it->second, state.split, dims.at(name))) out[name + "::" + key] = *split;
    }
  }
  return out;
}

}  // namespace

int tp_size_of(const CheckpointModel& model) { return model.tp_group ? model.tp_group->size() : 1; }

std::string tp_state_dir(const std::string& model_dir, const CheckpointModel& model) {
  const int size = tp_size_of(model);
  return size > 1 ? slice_dir(model_dir, model.tp_group->rank(), size) : model_dir;
}

std::string tp_layout_json(const CheckpointModel& model, const fsdp::ParamStates& states) {
  nlohmann::json j;
  j["size"] = tp_size_of(model);
  j["split"] = nlohmann::json::object();
  for (const auto& [name, split] : entry_splits(model, states)) {
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
    auto split = layout.split.find(name);
    if (split == layout.split.end()) {
      whole[name] = first;
      continue;
    }
    std::vector<at::Tensor> parts;
    for (const auto& slice : slices) {
      auto it = slice.find(name);
      if (it == slice.end()) throw std::runtime_error(model_dir + ": a tensor-parallel slice lacks '" + name + "'");
      parts.push_back(it->second);
    }
    whole[name] = tp::merge_parts(parts, split->second);
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
    const std::map<std::string, tp::SplitLayout> splits = entry_splits(model, states);
    for (auto& [name, value] : state) {
      auto split = splits.find(name);
      if (split == splits.end()) continue;
      try {
        value = tp::slice_of(value, split->second, rank, size);
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(model_dir + ": '" + name + "' does not split over " + std::to_string(size) +
                                 " tensor-parallel ranks (" + e.what() + ")");
      }
    }
  }
  fsdp::load_state_dict_rows(model.root, state, states);
}

}  // namespace shardtrain::ckpt
