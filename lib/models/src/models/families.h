// The zoo's rows (private to the models layer): each family's recipe file defines its own.
#pragma once

#include "shardtrain/models/zoo.h"

namespace shardtrain::models {

ModelFamily flava_family();  // lib/models/src/models/flava/flava_recipe.cpp
ModelFamily bert_family();   // lib/models/src/models/bert/bert_recipe.cpp
ModelFamily vit_family();    // lib/models/src/models/vit/vit_recipe.cpp
ModelFamily t5_family();     // lib/models/src/models/t5/t5_recipe.cpp
ModelFamily llama_family();    // lib/models/src/models/llama/llama_recipe.cpp, as the three below
ModelFamily mistral_family();
ModelFamily qwen2_family();
ModelFamily qwen3_family();
ModelFamily gpt2_family();   // lib/models/src/models/gpt2/gpt2_recipe.cpp

}  // namespace shardtrain::models
