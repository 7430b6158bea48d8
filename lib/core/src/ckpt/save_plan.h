// A checkpoint's save in two halves: what each rank writes, taken from the model between steps (plan_save:
// collective over the training groups), and the writing (write_save: collective over the group it is given —
// the world's, or one of the writer's own while training goes on: ckpt/async_save.h). save_checkpoint is the one
// after the other. Private to ckpt/.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"

namespace shardtrain::ckpt {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// checkpoint.state_dict_type = full under tensor or pipeline parallelism: model.safetensors merged (on the
// leader, from the files) out of the model/ directory this save has just written, under Hugging Face names
// ((ours, theirs) pairs).
struct ExportMerged {
  std::string model_dir;
  std::vector<std::pair<std::string, std::string>> hf_names;
};

// One file of a save: its path inside the .partial directory, and what it holds — a pickle (io::save_pickle),
// text, a safetensors file's tensors (io::write_safetensors), or the export merged from model/. Tensors are the
// model's own (views of its shards and states) until staged (ckpt/async_save.h).
struct PlannedFile {
  std::string path;
  std::variant<c10::IValue, std::string, NamedTensors, ExportMerged> contents;
};

struct SavePlan {
  int64_t step = 0;
  std::string final_path, partial;  // <dir>/step-00000100 and its .partial, which the leader has made
  TrainerState state;               // with every parameter's optimizer steps
  // This rank's files in phases: every rank has written a phase's files before any writes the next phase's (a
  // state dict's metadata after every shard; the merged export after both), then the manifest.
  std::vector<std::vector<PlannedFile>> phases;
};

// Checks that the parameters and optimizer state are finite on every rank (NonFiniteState when not; unless
// `check_finite` is false: the caller checks, refuse_non_finite), claims the step's .partial directory
// (CheckpointWriteFailed when the step's directory is another run's), and lists what this rank writes. Collective
// over `world` and the model's groups.
SavePlan plan_save(const std::string& dir, const TrainerState& given, const CheckpointModel& model,
                   const dist::Communicator& world, bool check_finite = true);

// The first of this rank's parameters and optimizer state tensors that holds NaN or Inf ("'w::exp_avg' holds 3 NaN
// or Inf values of 64"); "" when all are finite.
std::string non_finite_state(const CheckpointModel& model);
// When `found` (this rank's non_finite_state, or "") is not empty on some rank: the leader removes the plan's
// .partial directory and every rank throws NonFiniteState with the first such rank's. Collective over `world`.
void refuse_non_finite(const SavePlan& plan, const std::string& found, const dist::Communicator& world);

// Writes the plan's files phase by phase, the manifest, and renames the directory into place; returns its path.
// Collective over `writers`, a group of the same ranks as the plan's world (any other group's collectives may run
// meanwhile). Throws CheckpointWriteFailed, on every rank alike, with the first failing rank's reason, having
// removed the .partial directory.
std::string write_save(const SavePlan& plan, const dist::Communicator& writers);

}  // namespace shardtrain::ckpt
