// Text generation from a model of the zoo, as transformers' generate(): greedy decoding, sampling (temperature,
// top-k, top-p) or beam search, a repetition penalty, stopping at end-of-sequence tokens, each step reusing the keys
// and values of the earlier ones (a KV cache in every attention module). The model's recipe makes its TextDecoder
// (ModelRecipe::text_decoder: the causal LMs and T5):
//
//   models::ZooModel m = models::build_model(models::recipe_of_model("path/to/model"));
//   models::load_weights(*m.module, "path/to/model", m.names);
//   m.module->eval();
//   auto decoder = m.recipe->text_decoder(*m.module);
//   models::Generated out = models::generate(*decoder, prompt_ids, prompt_mask, options);
//
// Every step is a call of the model's root (T5's encoder pass and decoding steps too), so a sharded model generates
// as well: each unit gathers at each step, on every rank together. Ranks generating from the same prompts make the
// same tokens and end at the same step; ranks generating from prompts of their own (data parallel, each rank a
// different batch) end at different steps, so they step together until every rank's rows have ended —
// GenerationOptions::synced, transformers' synced_gpus (ModelsDist.ShardedModelsGenerateAsOneProcess).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::models {

// transformers' GenerationConfig keys of the same names (and defaults).
struct GenerationOptions {
  int64_t max_new_tokens = 20;
  bool do_sample = false;           // false: greedy, the highest score each step
  double temperature = 1.0;         // sampling: scores / temperature
  int64_t top_k = 50;               // sampling: the k highest scores kept (ties with the k-th too); 0: all
  double top_p = 1.0;               // sampling: the fewest highest-probability tokens whose total reaches top_p
  double repetition_penalty = 1.0;  // a token already in the sequence: its score / penalty (positive), * (negative)
  std::vector<int64_t> eos_token_ids;  // a row ends at the first of these it generates
  int64_t pad_token_id = 0;            // what a finished row generates
  uint64_t seed = 0;                   // sampling's generator
  // Beam search (num_beams > 1, greedy only): transformers' beam search, num_beams hypotheses a row scored by their
  // summed log-probabilities; a finished one by that sum / (its generated length ^ length_penalty). early_stopping:
  // "false" stops a row once no running beam can beat its worst finished one (transformers' heuristic, from the
  // current length), "true" once it has num_beams finished, "never" (the canonical search) looks at the longest
  // length when length_penalty > 0.
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  std::string early_stopping = "false";
  // transformers' synced_gpus: the ranks of this group (those a sharded model gathers over) generate from batches
  // of their own and step together, a rank whose rows have all ended feeding padding, until every rank's have (an
  // all-reduce of one flag a step). Every rank must call generate() alike: the same options, once per batch.
  std::optional<dist::Communicator> synced;
};

// Throws std::invalid_argument naming the option and its value for a value transformers refuses too
// (temperature <= 0 when sampling, top_p outside (0, 1], a negative top_k, repetition_penalty <= 0,
// max_new_tokens < 1, num_beams < 1, early_stopping not true, false or never), and for sampling with beams (beam
// sampling is not implemented).
void check_generation_options(const GenerationOptions& options);

// A model that continues token sequences, one token a step, keeping what earlier steps computed.
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  // Begins: prompt ids (B, T) and their mask (B, T), 1 = token, 0 = padding — on the left for a causal LM (the
  // prompt's last token in the last column), anywhere for an encoder-decoder's input. Returns the first generated
  // token's logits (B, vocab), float32.
  virtual at::Tensor start(const at::Tensor& ids, const at::Tensor& mask) = 0;
  // One token per row (B) appended: the next token's logits (B, vocab), float32.
  virtual at::Tensor next(const at::Tensor& tokens) = 0;
  // The tokens the sequence holds before the first generated one (what a repetition penalty looks at): a causal
  // LM's prompt; an encoder-decoder's decoder start token (B, 1).
  virtual at::Tensor sequences_at_start(const at::Tensor& prompt_ids) const { return prompt_ids; }
  // Beam search: row i continues as row rows[i] did (rows (B) int64: the state of each row — its KV caches, mask,
  // positions, encoder output — taken from that row's), before the next next(). The default throws
  // std::invalid_argument: a decoder that cannot does no beam search.
  virtual void reorder(const at::Tensor& rows);
};

// Scores of the next token (B, vocab) float32 as transformers' logits processors leave them, in their order: the
// repetition penalty over `sequences` (B, L), every token so far (the prompt's, padding included, and those
// generated); when sampling, then temperature, top-k and top-p, the tokens they drop set to -inf.
at::Tensor process_scores(const at::Tensor& logits, const at::Tensor& sequences, const GenerationOptions& options);

struct Generated {
  at::Tensor tokens;             // (B, N) the generated tokens, N <= max_new_tokens; pad_token_id after a row's end
  std::vector<int64_t> lengths;  // each row's tokens up to and including its end-of-sequence token
};

// Generates from `decoder` as transformers' generate() does, until every row has ended or max_new_tokens are made.
// prompt_ids, prompt_mask as TextDecoder::start. `on_step(made)` after each step, if given. No gradients. With
// num_beams > 1 each row's best hypothesis (the decoder runs B * num_beams rows, each prompt repeated).
// Throws std::invalid_argument as check_generation_options.
Generated generate(TextDecoder& decoder, const at::Tensor& prompt_ids, const at::Tensor& prompt_mask,
                   const GenerationOptions& options, const std::function<void(int64_t)>& on_step = {});

}  // namespace shardtrain::models
