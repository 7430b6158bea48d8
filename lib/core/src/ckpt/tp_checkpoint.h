// Tensor parallelism's part of a checkpoint's model/ directory (ckpt/checkpoint.h, CheckpointModel::tp_group):
//
//   model/tensor_parallel.json   {"size": T, "split": {"<parameter>" or "<parameter>::<state>": {"dim", "sections",
//                                "parts"}, ...}}: every split entry; one not listed is whole
//   model/tp-<t>-of-<T>/         rank t's slices as a sharded state dict (fsdp/state_dict.h), at any data size
//
// Without tensor parallelism model/ is the sharded state dict itself (size 1).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/fsdp/state_dict.h"

namespace shardtrain::ckpt {

// The tensor-parallel size a model is split into (1: not split).
int tp_size_of(const CheckpointModel& model);

// Where this rank writes its sharded state dict under model_dir, and (rank 0 of the world writes it) the layout
// file's text: how each split parameter and each of its states in `states` is split.
std::string tp_state_dir(const std::string& model_dir, const CheckpointModel& model);
std::string tp_layout_json(const CheckpointModel& model, const fsdp::ParamStates& states);

// Every entry of model_dir whole, the slices of a tensor-parallel save put back together along their dimensions
// (a parameter's states along its own), on CPU.
std::map<std::string, at::Tensor> merged_model_state(const std::string& model_dir);

// Loads model_dir into `model`: its own slices' directory when saved at the model's tensor-parallel size, else
// everything merged whole, this rank's slices taken (model.tp_split), then its rows (a replicated model: all of
// them). No communication.
void load_model_state(const std::string& model_dir, const CheckpointModel& model, const fsdp::ParamStates& states);

}  // namespace shardtrain::ckpt
