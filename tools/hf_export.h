// Exports of a checkpoint under Hugging Face names: the layout of a model's file, and a whole model directory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"

namespace shardtrain::models {
class ModelRecipe;
}

namespace shardtrain::cli {

// The model a checkpoint holds: its flavor (or model directory) with the run's model.overrides.
std::shared_ptr<const models::ModelRecipe> recipe_of_checkpoint(const ckpt::TrainerState& state);

// What an export of `recipe`'s model holds: its module tree on the meta device (no memory) gives our names, the tied
// pairs (once), Hugging Face's names and the shapes.
std::vector<ckpt::ExportTensor> export_layout(const models::ModelRecipe& recipe);

// `checkpoint` (a step-* directory) as a Hugging Face model directory `out`: config.json (the source directory's
// when the run's model came from one, else the recipe's; torch_dtype the weights'), the weights (io::
// write_safetensors_files: sharded above `max_shard_bytes`), and the run's tokenizer (the source directory's files,
// or data.vocab as a BertTokenizer). Prints what it wrote. Throws what read_export_tensors throws.
void export_hf_directory(const std::string& checkpoint, const std::string& out, const ckpt::ExportOptions& options,
                         int64_t max_shard_bytes);

}  // namespace shardtrain::cli
