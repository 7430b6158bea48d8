// How a checkpoint's model/ directory is laid out (ckpt/checkpoint.h) under pipeline and tensor parallelism:
//
//   model/pipeline.json          {"size": P}: a pipeline's save, one directory per stage rank (absent: P = 1)
//   model/pp-<p>-of-<P>/         pipeline rank p's stages, each laid out as below (P = 1: model/ itself)
//     tensor_parallel.json       {"size": T, "split": {"<parameter>" or "<parameter>::<state>": {"dim", "sections",
//                                "parts"}, ...}}: every split entry; one not listed is whole
//     tp-<t>-of-<T>/             rank t's slices as a sharded state dict (fsdp/state_dict.h), at any data size
//
// Without tensor parallelism a stage's directory is the sharded state dict itself (T = 1). The stages hold
// disjoint entries under the whole model's names: merged, they are the model's.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/fsdp/state_dict.h"

namespace shardtrain::ckpt {

// The tensor-parallel size a model is split into (1: not split), and the pipeline's (1: no pipeline).
int tp_size_of(const CheckpointModel& model);
int pp_size_of(const CheckpointModel& model);
// Whether world rank `world_rank` is in the first data-parallel replica (the mesh's row and column 0: world rank
// 0's tensor-parallel groups, one at each stage), which writes a replicated model's slices and stages.
bool in_first_replica(const CheckpointModel& model, int world_rank);

// Where this rank writes its sharded state dict under model_dir (its stage's, then its slices' directory), and the
// layout files' texts: how each split parameter and each of its states in `states` is split (one rank of each
// stage writes it into the stage's directory), and the pipeline's size (world rank 0 writes it into model_dir).
std::string state_dir(const std::string& model_dir, const CheckpointModel& model);
std::string stage_dir(const std::string& model_dir, const CheckpointModel& model);
std::string tp_layout_json(const CheckpointModel& model, const fsdp::ParamStates& states);
std::string pipeline_json(const CheckpointModel& model);

// Every entry of model_dir whole: the stages' entries together, the slices of a tensor-parallel save put back
// together along their dimensions (a parameter's states along its own), on CPU.
std::map<std::string, at::Tensor> merged_model_state(const std::string& model_dir);

// Loads model_dir into `model`: its own directory when saved at the model's tensor-parallel size without a
// pipeline, else every entry the model holds merged whole, this rank's slices taken (model.tp_split), then its rows
// (a replicated model: all of them) — a pipeline stage its own layers' entries, from a save of any layout. No
// communication.
void load_model_state(const std::string& model_dir, const CheckpointModel& model, const fsdp::ParamStates& states);

}  // namespace shardtrain::ckpt
