// Transformer building blocks shared by every family of the zoo. TransformerLayer is an nn::Interceptable: it is
// the unit that wrap policies select for sharding and activation checkpointing. Its class name is the Hugging Face
// layer class of the family ("BertLayer", "ViTLayer", "FlavaLayer", "T5Block", "LlamaDecoderLayer"), so an
// Accelerate config's fsdp_transformer_layer_cls_to_wrap selects the same layers here.
//
// Shapes: B batch, T query positions, S key positions, C model width, H heads, D head width.
// Attention biases are additive float tensors broadcastable to (B, H, T, S): 0 where attending is allowed, the
// dtype's lowest value where not (padding_bias, causal_bias), or learned values (T5's relative position bias).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/models/build.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::models {

struct AttentionOptions {
  int64_t dim = 0;         // C
  int64_t heads = 0;       // H
  int64_t kv_heads = 0;    // grouped-query attention: H / kv_heads query heads share a key/value head; 0 = H
  int64_t head_dim = 0;    // D; 0 = C / H (T5 sets it: t5-3b has H*D = 4096 for C = 1024)
  bool qkv_bias = true;
  bool out_bias = true;
  bool scaled = true;      // softmax(q k^T / sqrt(D)); T5 folds the scale into its initialisation (no scaling)
  bool causal = false;     // each query attends to keys at its position and before
  bool re_attention = false;  // DeepViT: mix the heads' attention maps with a learned (H, H) matrix, then norm
  double dropout = 0.0;    // on attention probabilities, training only
  bool qk_norm = false;    // Qwen3: an RMSNorm over each head's D of the queries and of the keys, before RoPE
  double qk_norm_eps = 1e-6;
  bool fused_qkv = false;  // GPT-2's c_attn: one projection qkv (C -> (H + 2 kv_heads) D), split into q, k, v
  // Every projection's weight stored (in, out), Hugging Face's Conv1D (GPT-2; layers.h): attention's and, in a
  // TransformerLayer, its MLP's.
  bool transposed = false;
};

// What an attention module keeps between the steps of generation (models/kv_cache.h attaches one): its keys and
// values so far, after RoPE and before grouped heads are repeated, (B, kvH, S, D). Self-attention appends each call's
// to them; cross-attention computes its context's once, on the first call, and reuses them.
struct KvCache {
  at::Tensor keys, values;
};

// Multi-head attention on LibTorch's scaled_dot_product_attention. Children: q, k, v (C -> H*D or kv_heads*D), or
// with fused_qkv (self-attention only) qkv; o (H*D -> C); with re_attention also reattn_weights (H, H) and
// reattn_norm over heads; with qk_norm q_norm and k_norm (D). Interceptable: tensor parallelism enters its region
// around it (models/tensor_parallel.h), the heads split over the group (options then count this rank's).
class AttentionImpl : public nn::Interceptable<AttentionImpl, at::Tensor(const at::Tensor&, const at::Tensor&,
                                                                          const at::Tensor&, const at::Tensor&)> {
 public:
  AttentionImpl(const AttentionOptions& options, const torch::TensorOptions& tensor_options);
  // x (B, T, C); context (B, S, C) for cross-attention, undefined for self-attention; bias as above or undefined;
  // rope (2, T, D) cos and sin of rotary embeddings or undefined. Returns (B, T, C).
  // Causal: with no bias the kernel masks the future itself; a bias must already hide it, (..., T, S) from
  // causal_bias or hide_future, made once for all layers by the model (one made per layer would stay alive per
  // layer until backward: the fused kernels save their mask).
  // With a cache attached, the T queries attend to the cached keys and theirs: a causal layer's bias is then
  // (..., T, P + T) for P cached positions, and rope the T new positions' (2, T, D) or per row (2, B, 1, T, D).
  at::Tensor forward_impl(const at::Tensor& x, const at::Tensor& context, const at::Tensor& bias,
                          const at::Tensor& rope);

  AttentionOptions options;
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  Linear qkv{nullptr};  // fused_qkv
  at::Tensor reattn_weights;
  LayerNorm reattn_norm{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};
  KvCache* cache = nullptr;  // while generating: owned by the models/kv_cache.h KvCaches that attached it
};
TORCH_MODULE(Attention);

enum class Activation { kGelu, kGeluTanh, kRelu, kSwiGlu };

// Feed-forward: fc2(act(fc1(x))), or for kSwiGlu down(silu(gate(x)) * up(x)). x (..., C) -> (..., C).
// Interceptable, as Attention.
class MlpImpl : public nn::Interceptable<MlpImpl, at::Tensor(const at::Tensor&)> {
 public:
  MlpImpl(int64_t dim, int64_t hidden_dim, Activation activation, bool bias, double dropout,
          const torch::TensorOptions& options, bool transposed = false);  // transposed: as AttentionOptions
  at::Tensor forward_impl(const at::Tensor& x);

  Activation activation;
  double dropout;
  Linear fc1{nullptr}, fc2{nullptr};                  // kGelu, kGeluTanh, kRelu
  Linear gate{nullptr}, up{nullptr}, down{nullptr};   // kSwiGlu
};
TORCH_MODULE(Mlp);

enum class Norm { kLayerNorm, kRMSNorm };

struct TransformerLayerOptions {
  std::string class_name = "TransformerLayer";  // what module->name() reports (wrap policies match on it)
  AttentionOptions attention;
  int64_t mlp_dim = 0;
  Activation activation = Activation::kGelu;
  bool mlp_bias = true;
  Norm norm = Norm::kLayerNorm;
  double norm_eps = 1e-12;
  bool norm_first = true;        // pre-norm (ViT, FLAVA, T5, Llama); false: post-norm (BERT)
  bool cross_attention = false;  // a decoder layer attending to an encoder's output (T5)
  double dropout = 0.0;          // on each sub-layer's output, training only
  double mlp_dropout = 0.0;      // inside the feed-forward, after the activation (T5), training only
};

// One transformer layer. Children: norm1, attn, [norm_cross, cross_attn,] norm2, mlp.
//   pre-norm:  x += attn(norm1(x)); x += cross_attn(norm_cross(x), context); x += mlp(norm2(x))
//   post-norm: x = norm1(x + attn(x)); x = norm2(x + mlp(x))
// A layer may compute its output for the first `queries` positions only (the rows a head reads: a classifier reads
// the CLS token): those positions attend to all T keys, and nothing else runs for the others.
class TransformerLayerImpl
    : public nn::Interceptable<TransformerLayerImpl,
                               at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t)> {
 public:
  TransformerLayerImpl(const TransformerLayerOptions& options, const torch::TensorOptions& tensor_options);
  // x (B, T, C); bias for self-attention (see above); rope (2, T, D); context (B, S, C) and context_bias for
  // cross-attention. Unused arguments are undefined tensors. queries in [1, T]: the output's positions, the first
  // ones (a layer that is neither causal nor rotary nor cross-attending); 0: all. Returns (B, queries or T, C).
  at::Tensor forward_impl(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& rope,
                          const at::Tensor& context, const at::Tensor& context_bias, int64_t queries);

  TransformerLayerOptions options;
  torch::nn::AnyModule norm1, norm_cross, norm2;
  Attention attn{nullptr}, cross_attn{nullptr};
  Mlp mlp{nullptr};

 private:
  at::Tensor drop(const at::Tensor& x);
  at::Tensor forward_queries(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& rope, int64_t queries);
};
TORCH_MODULE(TransformerLayer);

// Builds `count` layers into a ModuleList registered on `parent` as `name`, handing each to finish_layer (qualified
// name `qualified_prefix`.N) as soon as it is built; returns them for typed calls. With build.stages (a pipeline
// stage's model) only the layers of those runs, in a container whose children keep the whole stack's indices
// ("layers.4" is the fifth layer wherever it is built): names, initial values and checkpoints are the whole model's.
std::vector<TransformerLayer> build_layers(torch::nn::Module& parent, const std::string& name,
                                           const std::string& qualified_prefix, int64_t count,
                                           const TransformerLayerOptions& options, const BuildOptions& build,
                                           std::vector<std::string>& built);

// Runs x through `layers` with the same extra arguments, all positions through every layer.
at::Tensor run_layers(std::vector<TransformerLayer>& layers, at::Tensor x, const at::Tensor& bias,
                      const at::Tensor& rope = {}, const at::Tensor& context = {}, const at::Tensor& context_bias = {});

// The dtype attention computes in for an input x: autocast's where it is on for x's device (DDP's mixed
// precision), else x's. A bias made in it is cast by no layer (a cast in each would copy it per layer).
at::ScalarType attention_dtype(const at::Tensor& x);
// The additive bias that hides padded keys: mask (B, S), 1 = real token, 0 = padding -> (B, 1, 1, S) in dtype.
at::Tensor padding_bias(const at::Tensor& mask, at::ScalarType dtype);
// padding_bias where the mask hides a key; undefined for an undefined mask or a CPU mask of ones: a bias of zeros
// changes nothing, and every checkpointed layer would keep it as an input through backward (as transformers drops
// such a mask). A device mask is not read (that would wait for the device).
at::Tensor padding_bias_if_padded(const at::Tensor& mask, at::ScalarType dtype);
// (1, 1, T, T): key positions after the query's hidden, and with window > 0 also those `window` or more before it
// (Mistral's sliding window: a query sees itself and the window - 1 positions before).
at::Tensor causal_bias(int64_t length, at::ScalarType dtype, const at::Device& device, int64_t window = 0);
// `bias` (padding (B, 1, 1, T), T5's position bias (1, H, T, T), ...) with what causal_bias hides set to the dtype's
// lowest: (..., T, T), the one bias every causal layer takes.
at::Tensor hide_future(const at::Tensor& bias, int64_t length, int64_t window = 0);
// RoPE's inverse frequencies theta^(-2i / head_dim), i < head_dim / 2: (head_dim / 2) float32, as transformers.
at::Tensor rotary_inv_freq(int64_t head_dim, double theta, const at::Device& device);
// Rotary embeddings for positions [0, length) from inv_freq (D / 2): (2, length, D) cos and sin, Hugging Face's
// half-split layout.
at::Tensor rotary_table(int64_t length, const at::Tensor& inv_freq);
// The same at each row's own positions (B, T) (generation: left padding shifts them): (2, B, 1, T, D).
at::Tensor rotary_at(const at::Tensor& positions, const at::Tensor& inv_freq);
// The bias of T new queries over all S = P + T keys when the first P are cached (generation): mask (B, S), 1 = token,
// 0 = padding -> (B, 1, T, S) in dtype, the padding, each query's future and with window > 0 the keys `window` or
// more before it hidden.
at::Tensor decode_bias(const at::Tensor& mask, int64_t queries, int64_t window, at::ScalarType dtype);

}  // namespace shardtrain::models
