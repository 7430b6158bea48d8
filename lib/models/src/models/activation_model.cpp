#include "models/activation_model.h"

#include <algorithm>

#include "shardtrain/models/losses.h"
#include "shardtrain/tp/split.h"

namespace shardtrain::models {

int64_t dropout_kept(double p, int64_t elements, const ActivationQuery& q) {
  if (!q.training || p <= 0) return 0;
  return (q.device == parallel::Device::CUDA) ? elements : elements * element_size(q);
}

int64_t norm_kept(Norm norm, int64_t rows, int64_t dim, const ActivationQuery& q, int64_t input_bytes) {
  const int64_t e = element_size(q), in = input_bytes > 0 ? input_bytes : e;
  if (norm == Norm::kLayerNorm) return 2 * rows * 4;  // at::layer_norm: mean and rstd in float32
  // RMSNorm: x.to(float32) (a copy unless float32) kept by pow and mul, rsqrt's result, and weight * normed kept by
  // the product with the weight (normed cast to the weight's dtype: float32 under autocast) unless it is frozen.
  const int64_t x32 = in == 4 ? 0 : rows * dim * 4;
  return x32 + (q.adapters.frozen ? 0 : rows * dim * (q.autocast ? 4 : e)) + rows * 4;
}

int64_t adapters_kept(int64_t rows, int64_t dim, int64_t mlp_dim, const ActivationQuery& q) {
  const ActivationQuery::Adapters& a = q.adapters;
  if (a.r <= 0) return 0;
  const int64_t modules = a.qkv + a.o + a.mlp_in + a.mlp_out, e = element_size(q);
  // A's product (rows, r), kept by B; with dropout, the dropped input (kept by A) and its noise, per module.
  int64_t bytes = modules * rows * a.r * e;
  if (q.training && a.dropout > 0) {
    const int64_t inputs = (a.qkv + a.o + a.mlp_in) * rows * dim + a.mlp_out * rows * mlp_dim;
    bytes += inputs * e + dropout_kept(a.dropout, inputs, q);
  }
  return bytes;
}

int64_t tp_part(int64_t extent, const ActivationQuery& q) {
  return q.tp > 1 ? tp::part_of(extent, q.tp, 0).size : extent;
}

int64_t stream_rows(int64_t rows, const ActivationQuery& q) { return q.sequence_parallel ? rows / q.tp : rows; }

TransformerLayerOptions tp_layer(const TransformerLayerOptions& layer, const ActivationQuery& q) {
  if (q.tp <= 1) return layer;
  TransformerLayerOptions local = layer;
  AttentionOptions& a = local.attention;
  if (a.head_dim <= 0) a.head_dim = a.dim / a.heads;
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  a.heads /= q.tp;
  a.kv_heads = std::max<int64_t>(1, kv / q.tp);
  local.mlp_dim /= q.tp;
  return local;
}

int64_t stream_size(const ActivationQuery& q) { return q.autocast ? 4 : element_size(q); }

int64_t stream_copies_kept(int64_t casts, int64_t elements, const ActivationQuery& q) {
  return (q.autocast ? casts : 1) * elements * element_size(q);
}

bool attention_fused(const AttentionOptions& a, const ActivationQuery& q) {
  const double p = q.training ? a.dropout : 0.0;
  return (q.device == parallel::Device::CUDA) ? !a.re_attention : (p <= 0 && !a.re_attention);  // CPU: dropout takes the math kernel
}

namespace {

// Attention's sizes over `tokens` queries and `keys` keys, in elements: q (B, T, H, D), k and v after
// repeat_interleave for grouped-query attention (the repeated copies are what attention keeps), the (B, H, T, S)
// scores.
struct AttentionSizes {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, q = 0, kv = 0, scores = 0;
};
AttentionSizes attention_sizes(const AttentionOptions& a, int64_t batch, int64_t tokens, int64_t keys) {
  AttentionSizes s;
  s.heads = a.heads, s.kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  s.head_dim = a.head_dim > 0 ? a.head_dim : a.dim / a.heads;
  s.q = batch * tokens * s.heads * s.head_dim;
  s.kv = 2 * batch * keys * (s.kv_heads != s.heads ? s.heads : s.kv_heads) * s.head_dim;
  s.scores = batch * s.heads * tokens * keys;
  return s;
}

// Attention's q/k/v, the attention itself and its output (the o projection's input), over `tokens` queries and
// `keys` keys. (Cross-attention's k/v projections keep the context: the encoder's output, kept once outside.)
int64_t attention_kept(const AttentionOptions& a, int64_t batch, int64_t tokens, int64_t keys,
                       const ActivationQuery& q) {
  const int64_t e = element_size(q);
  const AttentionSizes n = attention_sizes(a, batch, tokens, keys);
  // Qwen3's RMSNorms over each head of q and k keep what any RMSNorm keeps; their outputs are q and k below. Their
  // inputs, the projections' outputs, nothing else keeps: in float32 the norms' float32 input is that tensor.
  const int64_t q_heads = batch * tokens * n.heads, k_heads = batch * keys * n.kv_heads;
  const int64_t qk_norms = a.qk_norm ? norm_kept(Norm::kRMSNorm, q_heads, n.head_dim, q) +
                                           norm_kept(Norm::kRMSNorm, k_heads, n.head_dim, q) +
                                           (e == 4 ? (q_heads + k_heads) * n.head_dim * 4 : 0)
                                     : 0;
  const double p = q.training ? a.dropout : 0.0;
  if (attention_fused(a, q)) {
    // Flash / memory-efficient: q, k, v, the output, laid out (B, T, H, D) so o's input is a view of it, and the
    // float32 log-sum-exp.
    return qk_norms + (n.q + n.kv + n.q) * e + batch * n.heads * tokens * 4;
  }
  // Math: SDPA's math kernel works in float32 for bfloat16/float16 inputs (float32 copies of q, k, v are what its
  // products keep); DeepViT's re-attention in the compute dtype. Softmax keeps its result; with dropout, the noise
  // (CPU: a tensor; CUDA: a 1-byte mask) and the dropped probabilities (kept by the product with v). The output,
  // (B, H, T, D) cast back and reshaped, is a copy: o's input.
  const int64_t me = a.re_attention ? e : 4;
  int64_t bytes = (n.q + n.kv) * me + n.scores * me;
  if (p > 0) bytes += ((q.device == parallel::Device::CUDA) ? n.scores : n.scores * me) + n.scores * me;
  return qk_norms + bytes + n.q * e;
}

// Attention's part of transformer_layer_transients over `tokens` queries and `keys` keys, its input's norm included:
// its forward temporaries, and what its backward holds beside the kept tensors.
struct AttentionTransients {
  int64_t forward = 0, backward = 0;
};
AttentionTransients attention_transients(const AttentionOptions& a, int64_t batch, int64_t tokens, int64_t keys,
                                     const ActivationQuery& q) {
  const int64_t e = element_size(q);
  const AttentionSizes n = attention_sizes(a, batch, tokens, keys);
  const bool fused = attention_fused(a, q);
  const bool dropped = q.training && a.dropout > 0;
  // The math kernel's (B, H, T, S) scores: their softmax beside them, with dropout the noise and the dropped copy.
  const int64_t scores = fused ? 0 : n.scores * (a.re_attention ? e : 4);
  AttentionTransients t;
  t.forward = batch * tokens * a.dim * e + (2 * n.q + n.kv) * e + (dropped ? 3 : 2) * scores;
  // Fused: the gradients of q and of the (repeated) k and v; math: a (B, H, T, S) gradient made before the tensor
  // it replaces is freed.
  t.backward = fused ? (n.q + n.kv) * e : scores;
  return t;
}

int64_t mlp_kept(const TransformerLayerOptions& o, int64_t rows, const ActivationQuery& q) {
  const int64_t e = element_size(q), m = rows * o.mlp_dim * e;
  const int64_t drop = dropout_kept(o.mlp_dropout, rows * o.mlp_dim, q);
  if (q.adapters.frozen) {
    // An adapter on the output projection joins the fused node (fused_mlp.h: what it keeps is the same) unless a
    // dropout needs the activation itself (blocks.cpp); unfused, its A keeps the projection's input. A frozen
    // projection without an adapter keeps nothing of its input.
    const bool adapted = q.adapters.mlp_out > 0;
    const bool unfused = drop > 0 || (adapted && q.training && q.adapters.dropout > 0);
    switch (o.activation) {
      case Activation::kSwiGlu:  // gate and up; unfused silu(gate) too, and the product for an adapter
        return (adapted && unfused) || q.float8 ? 3 * m + (adapted ? m : 0) : 2 * m;
      case Activation::kRelu: return m + drop + (adapted && drop > 0 ? m : 0);  // relu's output; the dropped copy
      case Activation::kGelu:
      case Activation::kGeluTanh: return m + drop + (adapted && unfused ? m : 0);  // fc1's output; GELU's, unfused
    }
  }
  switch (o.activation) {
    // The activation and the output projection are one node keeping the activation's inputs (fused_mlp.h); under
    // float8, unfused: silu(gate) and the product (the float8 projection's input) too, GELU's output.
    case Activation::kSwiGlu: return q.float8 ? 4 * m : 2 * m;  // gate and up (silu(gate) * up recomputed)
    case Activation::kRelu: return m + (drop > 0 ? m + drop : 0);  // relu keeps its output; fc2 its (dropped) input
    case Activation::kGelu:
    case Activation::kGeluTanh:  // fc1's output; with dropout or float8 also fc2's input
      return drop > 0 || q.float8 ? 2 * m + drop : m;
  }
  return 0;
}

}  // namespace

namespace {

// What one TransformerLayer keeps (transformer_layer_kept's arguments): all of it, and the part on the MLP's side of
// its last attention (that attention's output dropout, the residual sums and norms after it, the MLP), which
// backward frees before it reaches that attention.
struct LayerKept {
  int64_t all = 0, mlp_side = 0;
};
LayerKept layer_kept(const TransformerLayerOptions& o, int64_t batch, int64_t tokens, int64_t context_tokens,
                     const ActivationQuery& q, int64_t queries) {
  if (queries <= 0) queries = tokens;
  const int64_t s = stream_size(q), d = o.attention.dim, rows = batch * tokens;
  // What follows the attention runs over the kept queries' rows only. Under tensor parallelism the stream between
  // the split regions (the input, sums, norms, the outputs' dropout) is a rank's slice of the sequence under
  // sequence parallelism, while each region's input (q/k/v's, the MLP's) is whole and its inside split (`local`).
  const TransformerLayerOptions local = tp_layer(o, q);
  const int64_t q_rows = batch * queries, sq_rows = stream_rows(q_rows, q), q_unit = sq_rows * d * s;
  const int64_t q_norm = norm_kept(o.norm, sq_rows, d, q, s), q_drop = dropout_kept(o.dropout, sq_rows * d, q);
  LayerKept k;
  // What the projections reading a stream keep of it: frozen ones nothing, unless an adapter reads it too.
  const ActivationQuery::Adapters& adapted = q.adapters;
  const bool attention_input = !adapted.frozen || adapted.qkv > 0, mlp_input = !adapted.frozen || adapted.mlp_in > 0;
  k.all = attention_kept(local.attention, batch, queries, tokens, q) + adapters_kept(q_rows, d, o.mlp_dim, q);
  if (o.norm_first) {
    // The input (kept by norm1), norm1 and its output (q/k/v's input, over every token); the residual sum after
    // attention (norm2's or norm_cross's input).
    const int64_t s_rows = stream_rows(rows, q);
    k.all += s_rows * d * s + norm_kept(o.norm, s_rows, d, q, s) +
             (attention_input ? stream_copies_kept(1, rows * d, q) : 0);
    if (o.cross_attention) {
      AttentionOptions cross = local.attention;
      cross.causal = false;
      k.all += q_drop + q_unit + q_norm + stream_copies_kept(1, q_rows * d, q) +
               attention_kept(cross, batch, queries, context_tokens, q);
    }
    // The last attention's dropout, the sum after it (norm2's input), norm2 and its output (the MLP's input).
    k.mlp_side = q_drop + q_unit + q_norm + (mlp_input ? stream_copies_kept(1, q_rows * d, q) : 0);
  } else {
    // Post-norm: the input (q/k/v's; under autocast its copy, the input itself feeding the residual sum only);
    // after attention its dropout, the sums before norm1 and norm2, norm1's output (the MLP's input); norm2's output
    // is the next layer's input.
    k.all += attention_input ? stream_copies_kept(1, rows * d, q) : 0;
    k.mlp_side = q_drop + q_unit + q_norm + (mlp_input ? stream_copies_kept(1, q_rows * d, q) : 0) + q_unit + q_norm;
  }
  k.mlp_side += mlp_kept(local, q_rows, q) + q_drop;
  k.all += k.mlp_side;
  return k;
}

}  // namespace

int64_t transformer_layer_kept(const TransformerLayerOptions& o, int64_t batch, int64_t tokens,
                               int64_t context_tokens, const ActivationQuery& q, int64_t queries) {
  return layer_kept(o, batch, tokens, context_tokens, q, queries).all;
}

int64_t frozen_input_layer_kept(const TransformerLayerOptions& o, int64_t batch, int64_t tokens,
                                int64_t context_tokens, const ActivationQuery& q) {
  const ActivationQuery::Adapters& a = q.adapters;
  const LayerKept k = layer_kept(o, batch, tokens, context_tokens, q, 0);
  const int64_t s = stream_size(q), e = element_size(q), d = o.attention.dim, rows = batch * tokens;
  const int64_t adapters = adapters_kept(rows, d, o.mlp_dim, q);
  const int64_t unit = rows * d * s, norm = norm_kept(o.norm, rows, d, q, s);
  const int64_t drop = dropout_kept(o.dropout, rows * d, q);
  // From q, k, v on as any layer; pre-norm, the input and norm1's statistics are not kept (nothing needs them).
  if (a.qkv > 0) return o.norm_first ? k.all - unit - norm : k.all;
  // From o on: attention keeps its output alone (o's input, the adapter's), then the MLP's side as any layer.
  if (a.o > 0) return adapters + attention_sizes(o.attention, batch, tokens, tokens).q * e + k.mlp_side;
  // From the MLP's input projections on: the sum after attention (norm2's input) and its norm keep nothing.
  if (a.mlp_in > 0) return adapters + k.mlp_side - drop - unit - norm;
  // The output projection alone: what its adapter reads (fused_mlp.h's node keeps SwiGLU's gate and up; unfused,
  // or GELU's node, one (rows, hidden) tensor), the output's dropout; post-norm, norm2 and its input.
  if (a.mlp_out > 0) {
    const bool unfused =
        dropout_kept(o.mlp_dropout, rows * o.mlp_dim, q) > 0 || (q.training && a.dropout > 0) || q.float8;
    const int64_t mlp = (o.activation == Activation::kSwiGlu && !unfused ? 2 : 1) * rows * o.mlp_dim * e;
    return adapters + mlp + drop + (o.norm_first ? 0 : unit + norm);
  }
  return 0;  // no adapter here: nothing in this layer needs a gradient
}

LayerTransients transformer_layer_transients(const TransformerLayerOptions& whole, int64_t batch, int64_t tokens,
                                             int64_t context_tokens, const ActivationQuery& q) {
  // Under tensor parallelism a rank's share of each region (`o`); the stream a rank's sequence slice under sequence
  // parallelism, each region's output a whole partial sum before its reduction (and under sequence parallelism its
  // gathered input beside it).
  const TransformerLayerOptions o = tp_layer(whole, q);
  const int64_t e = element_size(q), rows = batch * tokens, d = o.attention.dim;
  const int64_t unit = stream_rows(rows, q) * d * stream_size(q), whole_unit = rows * d * stream_size(q);
  const int64_t regions = q.tp > 1 ? whole_unit * (q.sequence_parallel ? 2 : 1) : 0;
  const int64_t m = rows * o.mlp_dim * e;
  const bool mlp_dropped = q.training && o.mlp_dropout > 0;
  // The MLP's forward temporaries, and what its output projection's backward holds beside the kept tensors.
  // With gradients, what the MLP computes and does not keep: swiglu_linear keeps gate and up, gelu_linear fc1's
  // output (their activations recomputed in backward); the output projection's result until the residual sum.
  int64_t mlp_forward = 0, mlp_backward = 0, mlp_unkept = unit;
  switch (o.activation) {
    // swiglu_linear: gate, up, silu(gate) and the product; backward silu(gate), the product's gradient and up's.
    // Under float8 nothing of it is recomputed: all kept (mlp_kept) but the projection's result.
    case Activation::kSwiGlu: mlp_forward = unit + 4 * m, mlp_backward = 3 * m, mlp_unkept = q.float8 ? unit : 2 * m;
      break;
    // gelu_linear: fc1's output and its GELU; backward one (rows, hidden) gradient, made in place.
    case Activation::kGelu:
    case Activation::kGeluTanh:
      mlp_forward = unit + 2 * m, mlp_backward = m, mlp_unkept = q.float8 ? unit : m + unit;
      break;
    // fc1's output, relu's (and the dropout's noise and output); backward fc2's input's gradient (the dropout's and
    // relu's backward each make one as a kept tensor of that size goes).
    case Activation::kRelu: mlp_forward = unit + (mlp_dropped ? 3 : 2) * m, mlp_backward = m; break;
  }
  // Float8 (nn::to_float8): the output projection's input cast through a float32 copy beside its float8 result.
  if (q.float8) mlp_forward += rows * o.mlp_dim * (4 + 1);
  AttentionTransients attn = attention_transients(o.attention, batch, tokens, tokens, q);
  if (o.cross_attention) {
    AttentionOptions cross = o.attention;
    cross.causal = false;
    const AttentionTransients c = attention_transients(cross, batch, tokens, context_tokens, q);
    attn = {std::max(attn.forward, c.forward), std::max(attn.backward, c.backward)};
  }
  // On top in forward: the residual stream.
  LayerTransients t;
  t.forward = unit + regions + std::max(attn.forward, mlp_forward);
  t.forward_unkept = regions + mlp_unkept;
  // Backward first reaches the MLP's output projection, whose weight's gradient it makes with the MLP's temporaries
  // and the output's gradient alive; by attention's every parameter of the layer has its gradient, what the MLP's
  // side kept is freed (less on top than the layer kept, then, where attention's backward is small) and the input's
  // gradient is being summed beside the output's.
  const int64_t out_projection = o.mlp_dim * d + (o.mlp_bias ? d : 0);  // a rank's share
  const int64_t mlp_side = layer_kept(whole, batch, tokens, context_tokens, q, 0).mlp_side;
  // Under tensor parallelism the region's entry sums its input's gradient over the ranks into a copy (whole).
  const int64_t entry_sum = q.tp > 1 ? whole_unit : 0;
  t.backward = {{unit + mlp_backward, out_projection}, {2 * unit + attn.backward - mlp_side + entry_sum, -1}};
  return t;
}

void add_transformer_layers(ActivationBytes& a, int64_t count, const TransformerLayerOptions& o, int64_t batch,
                            int64_t tokens, int64_t context_tokens, const ActivationQuery& q) {
  const LayerTransients t = transformer_layer_transients(o, batch, tokens, context_tokens, q);
  a.layer_forward_transient = std::max(a.layer_forward_transient, t.forward);
  a.layer_forward_unkept = std::max(a.layer_forward_unkept, t.forward_unkept);
  LayerActivations layer;
  layer.kept = transformer_layer_kept(o, batch, tokens, context_tokens, q);
  layer.input = stream_rows(batch * tokens, q) * o.attention.dim * stream_size(q);  // the previous layer's output
  layer.backward = t.backward;
  if (q.adapters.frozen && a.layers.empty() && count > 0) {
    // LoRA: the model's first layer reads frozen embeddings, an input that needs no gradient. (The first layers of
    // later stacks, T5's decoder and FLAVA's encoders, are counted as any layer: a little more than they keep.)
    LayerActivations first = layer;
    first.kept = frozen_input_layer_kept(o, batch, tokens, context_tokens, q);
    a.layers.push_back(first);
    --count;
  }
  a.layers.insert(a.layers.end(), count, layer);
}

LossBytes cross_entropy_bytes(int64_t rows, int64_t vocab, const ActivationQuery& q) {
  (void)q;
  const int64_t logits32 = rows * vocab * 4;
  // log_softmax keeps its float32 result; backward starts with that result's gradient and the logits' (float32).
  return {logits32, 2 * logits32};
}

void add_last_token_classifier(ActivationBytes& a, int64_t batch, int64_t dim, int64_t classes,
                               const ActivationQuery& q) {
  const LossBytes loss = cross_entropy_bytes(batch, classes, q);
  a.outside_layers += stream_copies_kept(1, batch * dim, q) + loss.kept;
  a.loss_transient = batch * classes * (element_size(q) + 4);
  a.loss_kept = loss.kept;
  a.backward_transient = loss.backward_transient;
}

LossBytes linear_cross_entropy_bytes(int64_t rows, int64_t vocab, int64_t dim, const ActivationQuery& q) {
  const int64_t e = element_size(q), weight = vocab * dim;
  const int64_t chunk = std::min<int64_t>(rows, linear_cross_entropy_chunk_rows(vocab)) * vocab;
  LossBytes out;
  // A chunk: its logits in the compute dtype, then in float32, then their float32 log-softmax, in which the
  // gradient is made in place (its compute-dtype copy beside it is less): two float32 copies at most.
  const int64_t chunk_peak = 2 * chunk * 4;
  if (q.adapters.frozen) {  // the head frozen (LoRA): the rows' gradient alone, in their dtype
    out.kept = rows * dim * (q.autocast ? 4 : e);
    out.forward_transient = chunk_peak + (q.autocast ? weight * e : 0);
  } else if (e == 4 || q.autocast) {
    // Rows and weight in float32 (under autocast the final norm's output and the parameters are): the gradients
    // are kept from the start, the weight's summed in place; autocast casts the weight for each chunk's logits.
    out.kept = rows * dim * 4 + weight * 4;
    out.forward_transient = e == 4 ? chunk_peak : std::max(chunk_peak, weight * e + chunk * e);
  } else {
    // Cast to the compute dtype: the weight's gradient sums in float32 through the chunks and becomes the kept
    // compute-dtype one at the end, the float32 one still alive then.
    out.kept = rows * dim * e + weight * e;
    out.forward_transient = std::max(weight * 4 + chunk_peak - weight * e, weight * 4);
  }
  return out;
}

}  // namespace shardtrain::models
