// A checkpoint, or weights saved some other way, as Hugging Face's formats: one safetensors file under transformers'
// names, a model directory from_pretrained loads (config.json, the weights, the tokenizer), and a LoRA run's adapter
// as PEFT saves it. Each returns what it wrote, in a line for a person; a directory it made is removed again when a
// write fails (a full disk), and every file is written atomically.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"

namespace shardtrain::models {
class ModelRecipe;
}
namespace shardtrain::io {
class WeightFiles;
}

namespace shardtrain::hf {

// What an export of `recipe`'s model holds: its module tree on the meta device (no memory) gives our names, the tied
// pairs (once), Hugging Face's names and the shapes.
std::vector<ckpt::ExportTensor> export_layout(const models::ModelRecipe& recipe);

// `checkpoint` (a step-* directory) as one safetensors file `out` under Hugging Face names (ckpt::export_checkpoint
// of its run's layout); a LoRA run's adapters merged into their weights (models::merge_lora), the tensors whole in
// memory. Throws what read_export_tensors throws.
std::string export_model_file(const std::string& checkpoint, const std::string& out,
                              const ckpt::ExportOptions& options);

// A LoRA run's adapter as PEFT's save_pretrained writes it: `out`/adapter_config.json and adapter_model.safetensors
// (the adapters and modules_to_save; base_model_name_or_path the run's model.from, else its flavor), which
// PeftModel.from_pretrained loads over the base model. Throws std::invalid_argument for a run without LoRA.
std::string export_peft_adapter(const std::string& checkpoint, const std::string& out,
                                const ckpt::ExportOptions& options);

// `checkpoint` (a step-* directory) as a Hugging Face model directory `out` (a LoRA run's adapters merged):
// config.json (the source directory's when the run's model came from one, else the recipe's; torch_dtype the
// weights'), the weights (io::write_safetensors_files: sharded above `max_shard_bytes`), and the run's tokenizer
// (the source directory's files, or data.vocab as a BertTokenizer). Throws what read_export_tensors throws.
std::string export_directory(const std::string& checkpoint, const std::string& out,
                             const ckpt::ExportOptions& options, int64_t max_shard_bytes);

// Tensors `names` of `files` (every one, in the files' order, when `names` is empty) whole: floating ones cast to
// options.dtype when set. Throws naming a tensor that holds NaN or Inf unless options.allow_non_finite.
std::vector<std::pair<std::string, at::Tensor>> read_weights(const io::WeightFiles& files,
                                                             const std::vector<std::string>& names,
                                                             const ckpt::ExportOptions& options);

// Weights that are not a shardtrain checkpoint — a PyTorch distributed checkpoint, the directory Accelerate's
// save_state fills, a pytorch_model.bin: whatever io::WeightFiles reads at `path` — as a Hugging Face model
// directory `out`, for the model of the config.json beside them (or in the directory above: Accelerate's
// pytorch_model_fsdp_0/). Every tensor of that model must be there under transformers' name and in its shape
// (else an error names the missing ones); the checkpoint's others (an optimizer's, another task's head) are left
// and counted. Writes config.json (torch_dtype the weights'), the weights as export_hf_directory does, and the
// tokenizer files found beside the config.
std::string export_from_weights(const std::string& path, const std::string& out, const ckpt::ExportOptions& options,
                                int64_t max_shard_bytes);

}  // namespace shardtrain::hf
