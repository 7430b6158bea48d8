// LoRA fine-tuning (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") as Hugging Face's PEFT
// sets it up with a LoraConfig: each target Linear of the transformer layers gains a rank-r adapter beside its
// frozen weight, y = x W^T + b + dropout(x) A^T B^T * (lora_alpha / r), and only the adapters (and modules_to_save,
// a classifier made for the task) train. The base model's weights, gathered and computed with as before, get no
// gradient, no optimizer state and no reduction; a run checkpoints everything, and exports either the merged
// model (W + scale B A: transformers loads it as any model) or the adapter alone, as PEFT's save_pretrained writes
// it (adapter_config.json, adapter_model.safetensors: PeftModel.from_pretrained loads it over the base model).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/models/lora_spec.h"

namespace shardtrain::models {

class ModelRecipe;
class NameMap;

// `recipe`'s model with adapters (`recipe` itself when !spec.enabled()). Its build() adds them to the target
// Linears of each transformer layer as the layer is built, before BuildOptions::on_layer sees it (so FSDP shards
// them with it), initialised as PEFT does (A kaiming-uniform, bound 1/sqrt(in), seeded by the run's seed and the
// parameter's name; B zero: the model starts as the base model), and freezes every other parameter except
// modules_to_save's. Its activation_bytes() tell the family's memory model which projections carry adapters and that
// the rest is frozen (ActivationQuery::Adapters); its training_flops() leave out the frozen weights' gradients.
// Throws std::invalid_argument (building the model on the meta device once) when a target module or a module to
// save named in `spec` matches nothing, naming the layer's Linear modules; for r < 0, lora_alpha <= 0 or a dropout
// outside [0, 1).
std::shared_ptr<const ModelRecipe> with_lora(std::shared_ptr<const ModelRecipe> recipe, const LoraSpec& spec);

// What a LoRA model's build adapted and trains: the adapted modules by their Hugging Face names inside a layer
// (self_attn.q_proj, self_attn.v_proj; what adapter_config.json's target_modules lists, matching them and nothing
// outside the layers), in the order found; the modules saved whole, as model.lora names them (classifier); how
// many modules were adapted; the parameters that train and all of them (tied ones once).
struct LoraTargets {
  std::vector<std::string> target_modules, modules_to_save;
  int64_t adapted_modules = 0, trainable = 0, total = 0;
  bool fan_in_fan_out = false;  // the adapted weights are stored (in, out), Conv1D (GPT-2: PEFT sets it so)
};
LoraTargets lora_targets(const ModelRecipe& recipe, const LoraSpec& spec);

// "r 8, lora_alpha 16, lora_dropout 0.05 on 28 modules (self_attn.q_proj, ...), classifier trained whole;
// trainable params: 188,416 || all params: 4,581,632 || trainable%: 4.1124" (the last part PEFT's
// print_trainable_parameters), for start-up lines and exports.
std::string describe_lora(const LoraSpec& spec, const LoraTargets& targets);
// "LoRA r 8 (14 modules; 16384 of 139584 parameters train)": what a plan or an estimate names beside the model.
std::string lora_label(const LoraSpec& spec, const LoraTargets& targets);

// The weights file of an adapter directory (model.lora.from): adapter_model.safetensors, or PEFT's older
// adapter_model.bin. Throws std::invalid_argument naming the directory when it holds neither.
std::string lora_adapter_file(const std::string& dir);

// What PEFT's adapter files put before a Hugging Face name (the PeftModel's base_model, the LoraModel's model).
inline constexpr const char* kPeftModelPrefix = "base_model.model.";

// True for a tensor of an adapter ("....q_proj.lora_A.weight"), in our names or Hugging Face's.
bool is_lora_tensor(const std::string& name);

// Tensors under Hugging Face names with every adapter merged into its base weight, W + (lora_alpha / r) B A (in
// float32, back to W's dtype; (B A)^T for a weight names.is_transposed), and the adapters left out: the model
// transformers loads (PEFT's merge_and_unload). Throws std::invalid_argument for an adapter without its pair or its
// base weight.
std::vector<std::pair<std::string, at::Tensor>> merge_lora(std::vector<std::pair<std::string, at::Tensor>> tensors,
                                                           const LoraSpec& spec, const NameMap& names);

// True for a tensor of the adapter file (a Hugging Face name): an adapter's, or one of targets.modules_to_save.
bool in_lora_adapter(const std::string& hf_name, const LoraTargets& targets);

// The adapter as PEFT's save_pretrained writes adapter_model.safetensors: the tensors of `tensors` (Hugging Face
// names) in_lora_adapter, each under "base_model.model." + its name.
std::vector<std::pair<std::string, at::Tensor>> lora_adapter_tensors(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors, const LoraTargets& targets);

// adapter_config.json (JSON text): peft_type LORA, r, lora_alpha, lora_dropout, target_modules (the adapted
// modules, targets.target_modules), modules_to_save, task_type (PEFT's name of `task`: CAUSAL_LM, SEQ_2_SEQ_LM,
// SEQ_CLS, TOKEN_CLS, or null), base_model_name_or_path.
std::string lora_adapter_config(const LoraSpec& spec, const LoraTargets& targets, const std::string& task,
                                const std::string& base_model);

}  // namespace shardtrain::models
