// T5 (Raffel et al.), as Hugging Face's T5ForConditionalGeneration for the original checkpoints (t5-small ... t5-11b):
// pre-norm encoder-decoder with RMS norms, unscaled attention, bucketed relative position biases computed once per
// stack, ReLU feed-forward, output head tied to the shared embedding (scaled by dim^-1/2).
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct T5Config {
  int64_t vocab_size = 32128;
  int64_t dim = 512;      // d_model
  int64_t head_dim = 64;  // d_kv
  int64_t mlp_dim = 2048;  // d_ff
  int64_t layers = 6;     // in the encoder and in the decoder
  int64_t heads = 8;
  int64_t buckets = 32;   // relative_attention_num_buckets
  int64_t max_distance = 128;
  double norm_eps = 1e-6;
  double dropout = 0.1;
  int64_t pad_token_id = 0;  // also the decoder's start token
  int64_t eos_token_id = 1;  // ends a text whose tokenizer closes it with no special token of its own
  // Span corruption's first sentinel (T5's <extra_id_0>; the next ones count down from it); -1: the vocabulary's
  // last id. The trainer sets it from the tokenizer (models::TaskSetup).
  int64_t first_sentinel = -1;
};

// t5-small, t5-base, t5-large, t5-3b, t5-11b (the published configurations), t5-debug.
std::vector<std::string> t5_flavors();
T5Config t5_flavor(const std::string& name);
// Its T5Block: pre-norm RMSNorm, ReLU, unscaled attention; the decoder's causal, with cross-attention.
TransformerLayerOptions t5_layer_options(const T5Config& config, bool is_decoder);

// One stack: layers.N (class "T5Block"), relative_bias (buckets -> one bias per head), norm.
class T5StackImpl : public torch::nn::Module {
 public:
  T5StackImpl(const T5Config& config, bool decoder, const std::string& qualified_name, const BuildOptions& build,
              std::vector<std::string>& built);
  // embedded (B, T, C); mask (B, T) or undefined; for the decoder, encoder_out (B, S, C) and encoder_mask.
  at::Tensor forward(const at::Tensor& embedded, const at::Tensor& mask, const at::Tensor& encoder_out,
                     const at::Tensor& encoder_mask);
  // Cached decoding (the decoder, generation.h): embedded (B, 1, C) at `position`, the earlier positions in the
  // attention modules' KV caches (cross-attention's keys and values made from encoder_out at position 0).
  at::Tensor decode(const at::Tensor& embedded, int64_t position, const at::Tensor& encoder_out,
                    const at::Tensor& encoder_mask);
  // (1, H, T, S) learned bias of query i (at position first_query + i) for key j, from the bucket of j - i (HF's
  // _relative_position_bucket).
  at::Tensor position_bias(int64_t queries, int64_t keys, int64_t first_query = 0);

  T5Config config;
  bool decoder;
  std::vector<TransformerLayer> layers;
  Embedding relative_bias{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(T5Stack);

struct T5Outputs {
  at::Tensor logits;          // (B, T_dec, vocab)
  at::Tensor loss;            // () cross-entropy against labels (-100 ignored), when given
  at::Tensor encoder_hidden;  // (B, T_enc, C)
  static auto fields() {  // forward_impl's tensors, in order (named_outputs.h)
    return std::make_tuple(&T5Outputs::logits, &T5Outputs::loss, &T5Outputs::encoder_hidden);
  }
};

// Children: shared, encoder, decoder.
class T5Impl : public nn::Interceptable<T5Impl, std::vector<at::Tensor>(at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                                                        bool, at::Tensor, int64_t)> {
 public:
  T5Impl(const T5Config& config, const BuildOptions& build = {});
  // input_ids (B, S); attention_mask (B, S) or undefined; decoder_input_ids (B, T), or undefined to use labels
  // shifted right behind the start token; labels (B, T) or undefined (neither: the encoder alone, only
  // encoder_hidden defined). labelled_only (with labels): the loss alone, the tied head at the labelled positions
  // only, fused with the cross-entropy in chunks (linear_cross_entropy): the same loss and gradients without the
  // (B, T, vocab) logits.
  T5Outputs run(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                const at::Tensor& decoder_input_ids = {}, const at::Tensor& labels = {}, bool labelled_only = false);
  // run's arguments, and two of transformers' for decoding: encoder_outputs (B, S, C), the encoder's output of the
  // same input_ids, used instead of running the encoder again (input_ids may then be undefined); cache_position
  // >= 0: one cached decoding step (generation.h), decoder_input_ids (B, 1) at that decoder position, the earlier
  // positions in the decoder's KV caches (kv_cache.h), the logits (B, 1, vocab). Both go through the root's
  // interceptors as any call: a sharded model gathers for them.
  std::vector<at::Tensor> forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                       const at::Tensor& decoder_input_ids, const at::Tensor& labels,
                                       bool labelled_only, const at::Tensor& encoder_outputs, int64_t cache_position);
  // Generation and evaluation: encode is run's encoder alone, (B, S, C); decode_step the logits (B, 1, vocab)
  // after tokens (B, 1) at decoder position `position` (forward_impl's cache_position).
  at::Tensor encode(const at::Tensor& input_ids, const at::Tensor& attention_mask);
  at::Tensor decode_step(const at::Tensor& tokens, int64_t position, const at::Tensor& encoded,
                         const at::Tensor& attention_mask);

  T5Config config;
  Embedding shared{nullptr};
  T5Stack encoder{nullptr}, decoder{nullptr};
};
TORCH_MODULE(T5);

NameMap t5_names();

}  // namespace shardtrain::models
