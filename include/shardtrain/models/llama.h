// Llama 2 / 3 (Touvron et al.; Meta), as Hugging Face's LlamaForCausalLM: RMSNorm, rotary position embeddings,
// SwiGLU feed-forward, grouped-query attention, untied output head.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct LlamaConfig {
  int64_t vocab_size = 128256;
  int64_t dim = 4096;
  int64_t layers = 32;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t mlp_dim = 14336;
  int64_t max_positions = 8192;
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
};

// llama-3-8b, llama-3-70b, llama-2-7b (the published configurations), llama-debug.
std::vector<std::string> llama_flavors();
LlamaConfig llama_flavor(const std::string& name);
TransformerLayerOptions llama_layer_options(const LlamaConfig& config);  // its decoder layer (RMSNorm, SwiGLU, GQA)

struct LlamaOutputs {
  at::Tensor logits;  // (B, T, vocab); undefined when run labelled_only
  at::Tensor loss;    // () next-token cross-entropy (labels shifted inside, -100 ignored), when labels are given
};

// Children: embed, layers.N (class "LlamaDecoderLayer"), norm, lm_head.
class LlamaImpl
    : public nn::Interceptable<LlamaImpl, std::vector<at::Tensor>(at::Tensor, at::Tensor, at::Tensor, bool)> {
 public:
  LlamaImpl(const LlamaConfig& config, const BuildOptions& build = {});
  // input_ids (B, T); attention_mask (B, T) 1 = token, 0 = padding, or undefined; labels (B, T) or undefined.
  // labelled_only (with labels): the loss alone, the LM head at the positions whose next token has a label only
  // (padding and prompt tokens masked with -100 take none), fused with the cross-entropy in chunks
  // (linear_cross_entropy): the same loss and gradients without the (B, T, vocab) logits.
  LlamaOutputs run(const at::Tensor& input_ids, const at::Tensor& attention_mask = {}, const at::Tensor& labels = {},
                   bool labelled_only = false);
  std::vector<at::Tensor> forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                       const at::Tensor& labels, bool labelled_only);

  LlamaConfig config;
  Embedding embed{nullptr};
  std::vector<TransformerLayer> layers;
  RMSNorm norm{nullptr};
  Linear lm_head{nullptr};
};
TORCH_MODULE(Llama);

NameMap llama_names();

}  // namespace shardtrain::models
