#include "ckpt/model_layout.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <vector>

#include "shardtrain/io/files.h"

namespace shardtrain::ckpt {

namespace {

constexpr char kLayoutFile[] = "/tensor_parallel.json";
constexpr char kPipelineFile[] = "/pipeline.json";

std::string slice_dir(const std::string& model_dir, int64_t rank, int64_t size) {
  return model_dir + "/tp-" + std::to_string(rank) + "-of-" + std::to_string(size);
}

std::string pipeline_rank_dir(const std::string& model_dir, int64_t rank, int64_t size) {
  return size > 1 ? model_dir + "/pp-" + std::to_string(rank) + "-of-" + std::to_string(size) : model_dir;
}

// The pipeline size a model directory was saved at (1 without model/pipeline.json).
int64_t saved_pipeline_size(const std::string& model_dir) {
  const std::string path = model_dir + kPipelineFile;
  if (!io::path_exists(path)) return 1;
  int64_t size = 0;
  try {
    const std::vector<char> bytes = io::read_file(path);
    size = nlohmann::json::parse(bytes.begin(), bytes.end()).at("size").get<int64_t>();
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not a pipeline layout (" + e.what() + ")");
  }
  if (size < 1) throw std::runtime_error(path + ": size " + std::to_string(size) + " is not 1 or more");
  return size;
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
int pp_size_of(const CheckpointModel& model) { return model.pp_group ? model.pp_group->size() : 1; }

bool in_first_replica(const CheckpointModel& model, int world_rank) {
  // The mesh's ranks (dist::DeviceMesh): ((p * replicate + row) * shard + col) * tp + t. The pipeline group's first
  // rank is this rank's (row, col, t) at p = 0, which is under tp exactly when row = col = 0.
  const int at_first_stage = pp_size_of(model) > 1 ? model.pp_group->global_ranks().front() : world_rank;
  return at_first_stage < tp_size_of(model);
}

std::string stage_dir(const std::string& model_dir, const CheckpointModel& model) {
  const int size = pp_size_of(model);
  return pipeline_rank_dir(model_dir, size > 1 ? model.pp_group->rank() : 0, size);
}

std::string state_dir(const std::string& model_dir, const CheckpointModel& model) {
  const std::string stage = stage_dir(model_dir, model);
  const int size = tp_size_of(model);
  return size > 1 ? slice_dir(stage, model.tp_group->rank(), size) : stage;
}

std::string pipeline_json(const CheckpointModel& model) {
  nlohmann::json j;
  j["size"] = pp_size_of(model);
  return j.dump(2);
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

namespace {

// One stage's directory (model/ itself without a pipeline) read entry by entry, each merged whole from the
// tensor-parallel slices that hold it (their files mapped, one entry assembled at a time).
class MergedStage {
 public:
  explicit MergedStage(const std::string& model_dir) : dir_(model_dir), layout_(read_layout(model_dir)) {
    if (layout_.size == 1) {
      slices_.emplace_back(model_dir);
      return;
    }
    for (int64_t t = 0; t < layout_.size; ++t) slices_.emplace_back(slice_dir(model_dir, t, layout_.size));
  }
  const std::vector<std::string>& names() const { return slices_.front().names(); }
  bool has(const std::string& name) const { return slices_.front().has(name); }
  // Entry `name` whole; undefined when the stage has none.
  at::Tensor whole(const std::string& name) const {
    if (!slices_.front().has(name)) return {};
    auto split = layout_.split.find(name);
    if (split == layout_.split.end()) return slices_.front().whole(name);
    std::vector<at::Tensor> parts;
    for (const fsdp::ShardedStateReader& slice : slices_) {
      if (!slice.has(name)) throw std::runtime_error(dir_ + ": a tensor-parallel slice lacks '" + name + "'");
      parts.push_back(slice.whole(name));
    }
    return tp::merge_parts(parts, split->second);
  }

 private:
  std::string dir_;
  SavedLayout layout_;
  std::vector<fsdp::ShardedStateReader> slices_;
};

// A model directory's stages together: each entry from the stage that holds it.
class MergedModel {
 public:
  explicit MergedModel(const std::string& model_dir) {
    const int64_t size = saved_pipeline_size(model_dir);
    for (int64_t p = 0; p < size; ++p) stages_.emplace_back(pipeline_rank_dir(model_dir, p, size));
    for (const MergedStage& stage : stages_) names_.insert(names_.end(), stage.names().begin(), stage.names().end());
  }
  const std::vector<std::string>& names() const { return names_; }
  at::Tensor whole(const std::string& name) const {
    for (const MergedStage& stage : stages_) {
      if (stage.has(name)) return stage.whole(name);
    }
    return {};
  }

 private:
  std::vector<MergedStage> stages_;
  std::vector<std::string> names_;
};

}  // namespace

std::map<std::string, at::Tensor> merged_model_state(const std::string& model_dir) {
  const MergedModel merged(model_dir);
  std::map<std::string, at::Tensor> whole;
  for (const std::string& name : merged.names()) whole[name] = merged.whole(name);
  return whole;
}

void load_model_state(const std::string& model_dir, const CheckpointModel& model, const fsdp::ParamStates& states) {
  const int size = tp_size_of(model);
  // A pipeline's stages (either side) may be cut otherwise than the save's (another pp_stages_per_rank): their
  // entries are taken by name.
  const bool staged = saved_pipeline_size(model_dir) > 1 || pp_size_of(model) > 1;
  if (!staged && read_layout(model_dir).size == size) {
    if (model.sharded) {
      fsdp::load_sharded_state_dict(model.root, state_dir(model_dir, model), states);
    } else {  // a replicated model (DDP's) takes its slices whole
      const fsdp::ShardedStateReader mine(state_dir(model_dir, model));
      fsdp::load_state_dict_rows(
          model.root, [&](const std::string& name) { return mine.has(name) ? mine.whole(name) : at::Tensor(); },
          states);
    }
    return;
  }
  // At another size: each entry merged whole and this rank's slice taken (model.tp_split, and its states'), one
  // entry at a time.
  const MergedModel merged(model_dir);
  const std::map<std::string, tp::SplitLayout> splits = entry_splits(model, states);
  const int64_t rank = size > 1 ? model.tp_group->rank() : 0;
  auto entry_of = [&](const std::string& name) {
    at::Tensor value = merged.whole(name);
    auto split = splits.find(name);
    if (!value.defined() || size == 1 || split == splits.end()) return value;
    try {
      return tp::slice_of(value, split->second, rank, size).clone();
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(model_dir + ": '" + name + "' does not split over " + std::to_string(size) +
                               " tensor-parallel ranks (" + e.what() + ")");
    }
  };
  fsdp::load_state_dict_rows(model.root, entry_of, states);
}

}  // namespace shardtrain::ckpt
