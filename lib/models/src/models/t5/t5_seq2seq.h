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

// A batch's text rows as T5 reads them: per row the tokens of the first text (tokens[0]) and of a pair's second
// (tokens[1]), without special tokens or padding (Batch::sequence_ids), and the row's end-of-sequence token: the
// special token closing the row when the tokenizer adds one ([SEP], </s>), else config.eos_token_id.
struct TextRows {
  std::vector<std::vector<int64_t>> tokens[2];
  std::vector<int64_t> eos;
};
TextRows text_rows(const data::Batch& b, const T5Config& config);

// Rows of different lengths as one (rows, longest) int64 tensor on `device`, `pad` after each row's end: the
// encoder inputs and targets of both T5 tasks.
at::Tensor padded_rows(const std::vector<std::vector<int64_t>>& rows, int64_t pad, const at::Device& device);

}  // namespace shardtrain::models
