// T5's sequence-to-sequence fine-tuning task (private to the models layer; the recipe in t5_recipe.cpp offers it).
#pragma once

#include <memory>

#include "shardtrain/models/recipe.h"
#include "shardtrain/models/t5.h"

namespace shardtrain::models {

// seq2seq: records of (input, target) texts (data.text_fields: [input, target]) taught with teacher forcing;
// evaluated on data.eval by the loss per target token and, on greedy decoding up to the longest target of each
// batch, exact match and ROUGE-L against the targets.
std::unique_ptr<Task> make_t5_seq2seq(const T5Config& config);

}  // namespace shardtrain::models
