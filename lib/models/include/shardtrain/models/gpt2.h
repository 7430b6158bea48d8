// GPT-2 (Radford et al. 2019; OpenAI), as Hugging Face's GPT2LMHeadModel: learned position embeddings, pre-norm
// layers with LayerNorm, one fused query-key-value projection (c_attn), GELU (tanh approximation, "gelu_new") in the
// MLP, and the LM head tied to the token embedding. Its projections are Hugging Face's Conv1D, weights stored
// (in, out): the model keeps them so (LinearImpl's transposed), and its files load and save as they are.
// DistilGPT2 is the same model with 6 layers.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/causal_lm_outputs.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/sequence_classifier.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t max_positions = 1024;  // n_positions: the position table's rows
  int64_t dim = 768;             // n_embd
  int64_t layers = 12;           // n_layer
  int64_t heads = 12;            // n_head
  int64_t mlp_dim = 3072;        // n_inner (4 * n_embd when null)
  Activation activation = Activation::kGeluTanh;  // activation_function: gelu_new (tanh), gelu, relu
  double norm_eps = 1e-5;                         // layer_norm_epsilon
  double resid_dropout = 0.1, embd_dropout = 0.1, attn_dropout = 0.1;  // resid_pdrop, embd_pdrop, attn_pdrop
  SequenceClassifier classifier;  // GPT2ForSequenceClassification: score, no LM head (nothing tied)
};

// gpt2 (124M), gpt2-medium (355M), gpt2-large (774M), gpt2-xl (1.5B), distilgpt2 (82M): the published
// configurations; gpt2-debug.
std::vector<std::string> gpt2_flavors();
Gpt2Config gpt2_flavor(const std::string& name);
TransformerLayerOptions gpt2_layer_options(const Gpt2Config& config);  // its block: "GPT2Block"

using Gpt2Outputs = CausalLmOutputs;

// Children: embed (the token table, "wte", also the LM head's weight), pos_embed ("wpe"), layers.N (class
// "GPT2Block"), norm ("ln_f"). The tied table stays in the root unit (its lookups and the head share it). A
// classifier has score ((classes, dim), not a Conv1D) on each row's last token instead, as LlamaImpl's.
class Gpt2Impl
    : public nn::Interceptable<Gpt2Impl,
                               std::vector<at::Tensor>(at::Tensor, at::Tensor, at::Tensor, bool, at::Tensor)> {
 public:
  Gpt2Impl(const Gpt2Config& config, const BuildOptions& build = {});
  // input_ids (B, T); attention_mask (B, T) 1 = token, 0 = padding, or undefined; labels (B, T) or undefined.
  // Positions 0..T-1 whatever the padding (transformers' default). labelled_only and position_ids (cached decoding)
  // as LlamaImpl::run.
  Gpt2Outputs run(const at::Tensor& input_ids, const at::Tensor& attention_mask = {}, const at::Tensor& labels = {},
                  bool labelled_only = false, const at::Tensor& position_ids = {});
  std::vector<at::Tensor> forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                       const at::Tensor& labels, bool labelled_only, const at::Tensor& position_ids);

  Gpt2Config config;
  Embedding embed{nullptr}, pos_embed{nullptr};
  std::vector<TransformerLayer> layers;
  LayerNorm norm{nullptr};
  Linear score{nullptr};  // a classifier's
};
TORCH_MODULE(Gpt2);

NameMap gpt2_names();

}  // namespace shardtrain::models
