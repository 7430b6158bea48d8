#include "shardtrain/models/llama.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "layer_names.h"
#include "unknown_flavor.h"
#include "shardtrain/models/losses.h"

namespace shardtrain::models {

std::vector<std::string> llama_flavors() { return {"llama-3-8b", "llama-3-70b", "llama-2-7b", "llama-debug"}; }

LlamaConfig llama_flavor(const std::string& name) {
  LlamaConfig c;  // llama-3-8b (Meta-Llama-3-8B)
  if (name == "llama-3-8b") return c;
  if (name == "llama-3-70b") {
    c.dim = 8192, c.layers = 80, c.heads = 64, c.kv_heads = 8, c.mlp_dim = 28672;
    return c;
  }
  if (name == "llama-2-7b") {
    c.vocab_size = 32000, c.dim = 4096, c.layers = 32, c.heads = 32, c.kv_heads = 32, c.mlp_dim = 11008;
    c.max_positions = 4096, c.rope_theta = 10000.0;
    return c;
  }
  if (name == "llama-debug") {
    c.vocab_size = 1000, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.mlp_dim = 128;
    c.max_positions = 128, c.rope_theta = 10000.0;
    return c;
  }
  throw_unknown_flavor("Llama", name, llama_flavors());
}

TransformerLayerOptions llama_layer_options(const LlamaConfig& c) {
  TransformerLayerOptions l;
  l.class_name = "LlamaDecoderLayer";
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.kv_heads = c.kv_heads;
  l.attention.qkv_bias = false, l.attention.out_bias = false, l.attention.causal = true;
  l.mlp_dim = c.mlp_dim, l.activation = Activation::kSwiGlu, l.mlp_bias = false;
  l.norm = Norm::kRMSNorm, l.norm_eps = c.norm_eps;
  return l;
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(int64_t vocab, int64_t dim, const torch::TensorOptions& options)
    : Interceptable("LlamaEmbedding") {
  weight = register_parameter("weight", at::empty({vocab, dim}, options));
}

at::Tensor LlamaEmbeddingImpl::forward_impl(const at::Tensor& input_ids) { return at::embedding(weight, input_ids); }

LlamaLMHeadImpl::LlamaLMHeadImpl(int64_t dim, int64_t vocab, const torch::TensorOptions& options)
    : Interceptable("LlamaLMHead") {
  weight = register_parameter("weight", at::empty({vocab, dim}, options));
}

std::vector<at::Tensor> LlamaLMHeadImpl::forward_impl(const at::Tensor& hidden, const at::Tensor& targets) {
  if (!targets.defined()) return {at::linear(hidden, weight)};
  return {linear_cross_entropy(hidden, weight, at::Tensor(), targets)};
}

LlamaImpl::LlamaImpl(const LlamaConfig& c, const BuildOptions& build) : Interceptable("Llama"), config(c) {
  const auto& t = build.tensors;
  embed = register_module("embed", LlamaEmbedding(c.vocab_size, c.dim, t));
  std::vector<std::string> built;
  layers = build_layers(*this, "layers", "layers", c.layers, llama_layer_options(c), build, built);
  norm = register_module("norm", RMSNorm(c.dim, c.norm_eps, t));
  lm_head = register_module("lm_head", LlamaLMHead(c.dim, c.vocab_size, t));
  finish_model(build, *this, built);
}

namespace {

// mask (B, T): every row's ones come first.
bool is_right_padded(const at::Tensor& mask) {
  const int64_t t = mask.size(1);
  return t < 2 || (mask.narrow(1, 1, t - 1) <= mask.narrow(1, 0, t - 1)).all().item<bool>();
}

}  // namespace

LlamaOutputs LlamaImpl::run(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& labels,
                            bool labelled_only) {
  auto out = forward(input_ids, attention_mask, labels, labelled_only);
  return {out[0], out[1]};
}

std::vector<at::Tensor> LlamaImpl::forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                const at::Tensor& labels, bool labelled_only) {
  const int64_t length = input_ids.size(1);
  if (length > config.max_positions) {
    throw std::invalid_argument("Llama: " + std::to_string(length) + " tokens exceed max_positions " +
                                std::to_string(config.max_positions));
  }
  at::Tensor x = embed->forward(input_ids);
  // Right padding (each row's tokens, then its padding): under causal attention no real position sees a padded
  // one, so the padding mask changes only the padded positions' outputs. For the loss alone (labelled_only), when
  // no padded position predicts a label, the mask is left out and attention runs causal in the fused kernel: no
  // (B, 1, T, T) bias, the scores above the diagonal skipped. (CPU masks only: reading a device mask would wait
  // for the device.)
  const bool loss_only = labelled_only && labels.defined();
  const at::Tensor targets = loss_only ? next_token_labels(labels) : at::Tensor();  // (B, T)
  const bool causal_suffices = loss_only && attention_mask.defined() && attention_mask.device().is_cpu() &&
                               is_right_padded(attention_mask) &&
                               !((attention_mask == 0) & (targets != kIgnoreIndex)).any().item<bool>();
  const at::Tensor bias = attention_mask.defined() && !causal_suffices
                              ? padding_bias(attention_mask, x.scalar_type()) : at::Tensor();
  const at::Tensor rope = rotary_table(length, config.dim / config.heads, config.rope_theta, x.device());
  const at::Tensor hidden = norm->forward(run_layers(layers, x, bias, rope));
  if (loss_only) {  // no logits: the loss in chunks (linear_cross_entropy)
    const LabelledRows labelled = labelled_rows(hidden, targets);
    return {at::Tensor(), lm_head->forward(labelled.hidden, labelled.labels)[0]};
  }
  at::Tensor logits = lm_head->forward(hidden, at::Tensor())[0];
  return {logits, labels.defined() ? causal_lm_loss(logits, labels) : at::Tensor()};
}

NameMap llama_names() {
  NameRules rules = {prefix_rule("embed", "model.embed_tokens"), prefix_rule("norm", "model.norm")};
  append(rules, layer_rules("layers", "model.layers",
                            {{"attn.q", "self_attn.q_proj"},
                             {"attn.k", "self_attn.k_proj"},
                             {"attn.v", "self_attn.v_proj"},
                             {"attn.o", "self_attn.o_proj"},
                             {"norm1", "input_layernorm"},
                             {"norm2", "post_attention_layernorm"},
                             {"mlp.gate", "mlp.gate_proj"},
                             {"mlp.up", "mlp.up_proj"},
                             {"mlp.down", "mlp.down_proj"}}));
  return NameMap(rules, {"^model\\.layers\\.\\d+\\.self_attn\\.rotary_emb\\.inv_freq$"});
}


}  // namespace shardtrain::models
