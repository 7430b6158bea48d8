// model.lora of a trainer config (models/lora.h), apart from the LoRA machinery so that the config's header stays
// light: the standard library alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::models {

// model.lora in a trainer config, by PEFT's LoraConfig names.
struct LoraSpec {
  int64_t r = 0;              // each adapter's rank; 0: no LoRA (every parameter trains)
  double lora_alpha = 8;      // the adapters' output is scaled by lora_alpha / r (PEFT's defaults: r 8, alpha 8)
  double lora_dropout = 0;    // dropout on an adapter's input, in training
  // Hugging Face module names: a Linear of a transformer layer is adapted when its name is one of them or ends in
  // "." + one (PEFT's rule: q_proj, self_attn.q_proj). ["all-linear"]: every Linear of the layers. Empty: the query
  // and value projections, as PEFT's default for every family here (q_proj and v_proj, query and value, q and v).
  std::vector<std::string> target_modules;
  // Modules trained whole and saved with the adapter, matched the same way, with everything inside them. Empty: the
  // task's new head when the model has one ("classifier", as PEFT's task types SEQ_CLS and TOKEN_CLS add it) and
  // then the pooler it reads ("pooler": a masked-LM checkpoint has none, and PEFT's default would leave it random
  // and frozen); nothing for a model without a classifier.
  std::vector<std::string> modules_to_save;
  // An adapter to start from: the directory PEFT's save_pretrained (or `shardtrain checkpoint export --peft`)
  // wrote. Its adapter_config.json gives the fields above (config.cpp reads it), its adapter_model.safetensors the
  // adapters' and modules_to_save's starting values, over the base model's weights.
  std::string from;
  bool enabled() const { return r > 0; }
};

}  // namespace shardtrain::models
