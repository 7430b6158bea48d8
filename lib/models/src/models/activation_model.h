// The activation bytes of the shared blocks (blocks.cpp, layers.cpp), for the recipes' activation_bytes(). Private
// to the models layer. Every count names the tensor autograd saves and the op that saves it; `e` is the compute
// dtype's size, N = batch * tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/models/activation_memory.h"
#include "shardtrain/models/blocks.h"

namespace shardtrain::models {

// One TransformerLayer over `tokens` tokens per sample (and, for cross-attention, `context_tokens` of context),
// its input included (the previous layer's output: kept by norm1 in pre-norm, by q/k/v in post-norm); computing
// the first `queries` positions only (TransformerLayer's queries argument), 0: all.
int64_t transformer_layer_kept(const TransformerLayerOptions& layer, int64_t batch, int64_t tokens,
                               int64_t context_tokens, const ActivationQuery& q, int64_t queries = 0);

// transformer_layer_kept of a model's first layer under LoRA (q.adapters.frozen), whose input, the frozen
// embeddings' output, needs no gradient: nothing before the layer's first adapter keeps anything.
int64_t frozen_input_layer_kept(const TransformerLayerOptions& layer, int64_t batch, int64_t tokens,
                                int64_t context_tokens, const ActivationQuery& q);

// What one TransformerLayer (same arguments) holds on top while it runs, beyond what it keeps for backward:
// forward, a checkpointed layer computing without gradients (its temporaries: the largest sub-block's outputs
// alive at once); backward, its moments (LayerActivations::backward): the MLP's output projection, then attention.
struct LayerTransients {
  int64_t forward = 0;          // computing without gradients (checkpointed): every temporary
  int64_t forward_unkept = 0;   // computing with gradients: the temporaries it does not keep for backward
  std::vector<BackwardMoment> backward;
};
LayerTransients transformer_layer_transients(const TransformerLayerOptions& layer, int64_t batch, int64_t tokens,
                                             int64_t context_tokens, const ActivationQuery& q);
// Appends `count` TransformerLayers (transformer_layer_kept's arguments, all positions) to a.layers, in forward
// order, with their inputs and backward moments; their forward transients to a.layer_forward_transient and
// a.layer_forward_unkept when larger.
void add_transformer_layers(ActivationBytes& a, int64_t count, const TransformerLayerOptions& layer, int64_t batch,
                            int64_t tokens, int64_t context_tokens, const ActivationQuery& q);

// What a norm keeps besides its input and output (LayerNorm's statistics; RMSNorm's float32 input and normalized
// copy), over `rows` rows of `dim` whose input has `input_bytes` per element (0: the compute dtype's).
int64_t norm_kept(Norm norm, int64_t rows, int64_t dim, const ActivationQuery& q, int64_t input_bytes = 0);

// What a layer's LoRA adapters (q.adapters) keep over `rows` rows: each A's (rows, r) product, and with dropout each
// dropped input (dim wide, the output projection's mlp_dim) and its noise.
int64_t adapters_kept(int64_t rows, int64_t dim, int64_t mlp_dim, const ActivationQuery& q);

// Bytes per element of the residual stream (layer inputs, residual sums, norm outputs): the compute dtype's, but
// float32 under autocast (the weights stay float32, so sums with float32 embeddings and norms' float32 products
// promote; only the ops autocast lists — linear, matmul, attention, convolution — compute in bfloat16/float16).
int64_t stream_size(const ActivationQuery& q);
// What the linear layers reading a stream tensor of `elements` keep of it: the tensor itself in the compute dtype,
// or under autocast a compute-dtype copy per module that casts it (Attention and Mlp cast their input once for
// all their projections: `casts` is the number of such modules reading it).
int64_t stream_copies_kept(int64_t casts, int64_t elements, const ActivationQuery& q);

// Whether attention runs in a fused kernel (flash / memory-efficient), which saves its mask, the bias, for
// backward; the math kernel (CPU with dropout, DeepViT's re-attention) keeps no bias.
bool attention_fused(const AttentionOptions& attention, const ActivationQuery& q);

// A dropout mask over `elements` when dropout `p` is active: CPU's dropout multiplies by a noise tensor of the
// compute dtype (kept); CUDA's fused dropout keeps a 1-byte mask.
int64_t dropout_kept(double p, int64_t elements, const ActivationQuery& q);

// Cross-entropy over `rows` rows of `vocab` logits (losses.cpp: the logits cast to float32, log-softmax keeps its
// float32 result): kept, and what backward adds at its start (the result's gradient and the logits').
struct LossBytes {
  int64_t kept = 0, backward_transient = 0;
  int64_t forward_transient = 0;  // alive only while the loss runs
};
LossBytes cross_entropy_bytes(int64_t rows, int64_t vocab, const ActivationQuery& q);

// linear_cross_entropy (losses.h) over `rows` rows of width `dim` and a (vocab, dim) weight: it keeps the
// gradients it computed in forward, for the rows (rows, dim) and the weight (vocab, dim), in their dtypes (the
// compute dtype, or float32 under autocast and in float32); while it runs, a chunk's float32 logits and their
// log-softmax, and with cast weights the weight's float32 accumulator (else the kept gradient itself), under
// autocast the weight's compute-dtype copy with the chunk's logits.
LossBytes linear_cross_entropy_bytes(int64_t rows, int64_t vocab, int64_t dim, const ActivationQuery& q);

// A causal LM's sequence classifier (causal_lm.h last_token_rows) on top of what `a` keeps outside the layers: the
// (batch, dim) last-token rows the score reads (a copy) and the cross-entropy of its (batch, classes) logits; at the
// end of forward the logits and their float32 copy.
void add_last_token_classifier(ActivationBytes& a, int64_t batch, int64_t dim, int64_t classes,
                               const ActivationQuery& q);

// Tensor parallelism (q.tp): rank 0's part of a split extent (a vocabulary: tp/split.h, the longest part), the
// rows of the activations between split regions (under sequence parallelism a rank's slice of the sequence), and
// the layer as a rank computes it (heads and key/value heads, one at least, and the MLP's width split, the head
// size kept).
int64_t tp_part(int64_t extent, const ActivationQuery& q);
int64_t stream_rows(int64_t rows, const ActivationQuery& q);
TransformerLayerOptions tp_layer(const TransformerLayerOptions& layer, const ActivationQuery& q);

inline int64_t element_size(const ActivationQuery& q) { return static_cast<int64_t>(c10::elementSize(q.compute)); }

}  // namespace shardtrain::models
