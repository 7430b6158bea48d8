// Llama 2 / 3 (Touvron et al.; Meta), as Hugging Face's LlamaForCausalLM: RMSNorm, rotary position embeddings
// (plain, linearly scaled, or Llama 3.1's "llama3" scaling), SwiGLU feed-forward, grouped-query attention, an output
// head of its own or tied to the token embedding (Llama 3.2 1B and 3B). The same decoder is Mistral's
// (MistralForCausalLM: sliding-window attention), Qwen2's (Qwen2ForCausalLM: biases on q, k and v) and Qwen3's
// (Qwen3ForCausalLM: an RMSNorm over each head of q and k): one model, four families of the zoo, told apart by
// LlamaConfig::model_type.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/causal_lm_outputs.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/sequence_classifier.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

// The rotary embedding's frequency scaling (config.json's rope_scaling, or rope_parameters in transformers 5).
struct LlamaRopeScaling {
  std::string type = "default";  // "default" (none); "linear": every inverse frequency / factor; "llama3": those of
                                 // wavelength above original_max_positions / low_freq_factor / factor, those below
                                 // original_max_positions / high_freq_factor kept, the ones between interpolated
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // "llama3" only
  int64_t original_max_positions = 8192;             // "llama3" only: the context length of pretraining
};

struct LlamaConfig {
  std::string model_type = "llama";  // config.json's: "llama", "mistral", "qwen2" or "qwen3"
  int64_t vocab_size = 128256;
  int64_t dim = 4096;
  int64_t layers = 32;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 0;  // 0: dim / heads
  int64_t mlp_dim = 14336;
  int64_t max_positions = 8192;
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  LlamaRopeScaling rope_scaling;
  bool qkv_bias = false;             // biases on q, k and v (Llama's attention_bias; Qwen2's always)
  bool out_bias = false;             // a bias on o (Llama's attention_bias)
  bool mlp_bias = false;             // biases on gate, up and down
  bool tie_word_embeddings = false;  // the LM head is the token embedding's table
  int64_t sliding_window = 0;        // Mistral: a query sees the keys of its last sliding_window positions; 0: all
  bool qk_norm = false;              // Qwen3: q_norm and k_norm, RMSNorms over each head (norm_eps)
  SequenceClassifier classifier;     // LlamaForSequenceClassification (Mistral's, ...): score, no LM head

  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / heads; }
  bool tied_head() const { return tie_word_embeddings && !classifier.enabled(); }  // a classifier has no head to tie
  // Why the model cannot be built as pipeline stages, or "": a tied table would be at both ends of the stack, a
  // classifier's stages are not written (ModelRecipe::pipeline_stages_refused).
  std::string pipeline_stages_refused() const;
};

// llama-3-8b, llama-3.1-8b, llama-3.2-1b, llama-3.2-3b, llama-3-70b, llama-2-7b (the published configurations),
// llama-debug, llama-3.2-debug (3.2's tied head, head_dim and RoPE scaling at debug size).
std::vector<std::string> llama_flavors();
// mistral-7b (v0.1: a 4096-token sliding window), mistral-7b-v0.3, mistral-debug (a window of 8).
std::vector<std::string> mistral_flavors();
// qwen2.5-0.5b (tied head), qwen2.5-7b, qwen2-debug.
std::vector<std::string> qwen2_flavors();
// qwen3-0.6b (tied head), qwen3-8b, qwen3-debug.
std::vector<std::string> qwen3_flavors();
// Any of the four families' flavors.
LlamaConfig llama_flavor(const std::string& name);
// Hugging Face's class names of a model_type begin with: "Llama" (LlamaForCausalLM, LlamaModel,
// LlamaDecoderLayer), "Mistral", "Qwen2", "Qwen3".
std::string llama_hf_class_prefix(const std::string& model_type);
// The decoder layer's Hugging Face class: LlamaDecoderLayer, MistralDecoderLayer, Qwen2DecoderLayer or
// Qwen3DecoderLayer.
std::string llama_layer_class(const LlamaConfig& config);
TransformerLayerOptions llama_layer_options(const LlamaConfig& config);  // its decoder layer (RMSNorm, SwiGLU, GQA)
// The rotary embedding's inverse frequencies, (head_size / 2) float32 on `device`, scaled as config.rope_scaling
// says, as transformers computes them (in float32). Throws std::invalid_argument for a scaling type it lacks.
at::Tensor llama_inv_freq(const LlamaConfig& config, const at::Device& device);

// The token embedding and the LM head as modules of classes of their own ("LlamaEmbedding", "LlamaLMHead"), which
// FSDP makes units apart from the root (ModelRecipe::edge_unit_classes): each is then gathered around its own
// forward and backward only, where in the root both (two vocab x dim tensors, the model's largest) would stay
// gathered from the start of forward to the end of backward.
class LlamaEmbeddingImpl : public nn::Interceptable<LlamaEmbeddingImpl, at::Tensor(at::Tensor)>, public LookupModule {
 public:
  LlamaEmbeddingImpl(int64_t vocab, int64_t dim, const torch::TensorOptions& options);
  at::Tensor forward_impl(const at::Tensor& input_ids);  // (B, T) int64 -> (B, T, dim)
  at::Tensor weight;                                     // (vocab, dim)
};
TORCH_MODULE(LlamaEmbedding);

class LlamaLMHeadImpl : public nn::Interceptable<LlamaLMHeadImpl, std::vector<at::Tensor>(at::Tensor, at::Tensor)>,
                        public VocabParallelTable {
 public:
  LlamaLMHeadImpl(int64_t dim, int64_t vocab, const torch::TensorOptions& options);
  // hidden (..., dim), targets undefined: {logits (..., vocab)}. hidden (N, dim) rows and targets (N): {loss},
  // the head fused with the cross-entropy in chunks (linear_cross_entropy), no (N, vocab) logits. With a
  // vocab_shard (tensor parallelism), weight holds its rows and both are still the whole vocabulary's.
  std::vector<at::Tensor> forward_impl(const at::Tensor& hidden, const at::Tensor& targets);
  at::Tensor weight;  // (vocab, dim)
};
TORCH_MODULE(LlamaLMHead);

using LlamaOutputs = CausalLmOutputs;

// Children: embed (class "LlamaEmbedding"), layers.N (class "LlamaDecoderLayer"), norm, lm_head (class
// "LlamaLMHead"); built as pipeline stages, only theirs. With tie_word_embeddings (tied_head()): embed is a plain
// Embedding (tied_embed; no unit of its own: the head reads its table, so both stay in the root) and there is no
// lm_head. A classifier has score in place
// of lm_head (and so nothing tied; sequence_classifier.h): it scores each row's last token, the last whose
// attention_mask is 1 (the last position without a mask), which is transformers' last token that is not
// pad_token_id when padding is pad_token_id.
class LlamaImpl
    : public nn::Interceptable<LlamaImpl,
                               std::vector<at::Tensor>(at::Tensor, at::Tensor, at::Tensor, bool, at::Tensor)> {
 public:
  LlamaImpl(const LlamaConfig& config, const BuildOptions& build = {});
  // input_ids (B, T); attention_mask (B, T) 1 = token, 0 = padding, or undefined; labels (B, T) or undefined.
  // labelled_only (with labels): the loss alone, the LM head at the positions whose next token has a label only
  // (padding and prompt tokens masked with -100 take none), fused with the cross-entropy in chunks
  // (linear_cross_entropy): the same loss and gradients without the (B, T, vocab) logits.
  // position_ids (B, T) given: cached decoding (generation.h, the attention modules' KV caches attached): input_ids
  // are the new tokens at those positions, attention_mask (B, P + T) covers the P cached positions and these, and
  // the logits are the last position's, (B, 1, vocab).
  LlamaOutputs run(const at::Tensor& input_ids, const at::Tensor& attention_mask = {}, const at::Tensor& labels = {},
                   bool labelled_only = false, const at::Tensor& position_ids = {});
  std::vector<at::Tensor> forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                       const at::Tensor& labels, bool labelled_only, const at::Tensor& position_ids);
  // A model built as pipeline stages (BuildOptions::stages): forward runs stage `stage_to_run` of them — input_ids
  // the token ids (B, T) through the embedding when the stage starts the stack, else the stage before's hidden
  // states (B, T, dim; under sequence parallelism this tensor-parallel rank's slice, (B, T / tp, dim)) —, every
  // stage taking the microbatch's mask and labels (the attention bias depends on both); it returns {hidden
  // states}, or from the stage that ends the stack {the loss} of the labels as run(..., labelled_only = true)
  // computes it. An untied head only (a tied one's table is at both ends of the stack); not a classifier.
  at::Tensor run_stage(const at::Tensor& x, const at::Tensor& attention_mask, const at::Tensor& labels);

  LlamaConfig config;
  std::vector<StageLayers> stages;  // built as pipeline stages: their layer runs (layers holds them in order)
  int64_t stage_to_run = 0;         // which of `stages` forward runs
  LlamaEmbedding embed{nullptr};    // untied; a stage's only when it starts the stack (so norm and lm_head: ends)
  Embedding tied_embed{nullptr};    // tied, registered as "embed" too
  std::vector<TransformerLayer> layers;
  RMSNorm norm{nullptr};
  LlamaLMHead lm_head{nullptr};     // untied
  Linear score{nullptr};            // a classifier's: (classes, dim)
};
TORCH_MODULE(Llama);

NameMap llama_names();
// A classifier's: a file's lm_head.weight is a head it lacks (LoadReport::unused), not a tied copy to ignore.
NameMap llama_classifier_names();

}  // namespace shardtrain::models
