#include "models/activation_model.h"

namespace shardtrain::models {

int64_t dropout_kept(double p, int64_t elements, const ActivationQuery& q) {
  if (!q.training || p <= 0) return 0;
  return q.cuda ? elements : elements * element_size(q);
}

int64_t norm_kept(Norm norm, int64_t rows, int64_t dim, const ActivationQuery& q) {
  const int64_t e = element_size(q);
  if (norm == Norm::kLayerNorm) return 2 * rows * 4;  // at::layer_norm: mean and rstd in float32
  // RMSNorm: x.to(float32) (a copy unless float32) kept by pow and mul, rsqrt's result, and weight * normed kept by
  // the product with the weight (normed cast back to the compute dtype).
  const int64_t x32 = e == 4 ? 0 : rows * dim * 4;
  return x32 + rows * dim * e + rows * 4;
}

namespace {

// Attention's q/k/v, the attention itself and its output (the o projection's input), over `tokens` queries and
// `keys` keys.
int64_t attention_kept(const AttentionOptions& a, int64_t batch, int64_t tokens, int64_t keys,
                       const ActivationQuery& q) {
  const int64_t e = element_size(q);
  const int64_t h = a.heads, kvh = a.kv_heads > 0 ? a.kv_heads : a.heads;
  const int64_t hd = a.head_dim > 0 ? a.head_dim : a.dim / a.heads;
  // q, and k, v after repeat_interleave for grouped-query attention (the repeated copies are what attention keeps).
  int64_t bytes = batch * tokens * h * hd * e + 2 * batch * keys * (kvh != h ? h : kvh) * hd * e;
  // (Cross-attention's k/v projections keep the context: the encoder's output, kept once outside the layers.)
  const double p = q.training ? a.dropout : 0.0;
  const bool fused = q.cuda || (p <= 0 && !a.re_attention);  // CPU: dropout falls back to the math kernel
  if (fused) {
    // Flash / memory-efficient: the output, laid out (B, T, H, D) so o's input is a view of it, and the log-sum-exp.
    return bytes + batch * tokens * h * hd * e + batch * h * tokens * 4;
  }
  // Math: softmax's result, the dropout noise and the dropped probabilities (kept by the product with v), and the
  // output reshaped from (B, H, T, D) into o's input (a copy).
  const int64_t scores = batch * h * tokens * keys;
  bytes += scores * e + (p > 0 ? dropout_kept(p, scores, q) + scores * e : 0);
  return bytes + batch * tokens * h * hd * e;
}

int64_t mlp_kept(const TransformerLayerOptions& o, int64_t rows, const ActivationQuery& q) {
  const int64_t e = element_size(q), m = rows * o.mlp_dim * e;
  const int64_t drop = dropout_kept(o.mlp_dropout, rows * o.mlp_dim, q);
  switch (o.activation) {
    case Activation::kSwiGlu: return 4 * m;  // gate (silu's input), silu's output, up, their product (down's input)
    case Activation::kRelu: return m + (drop > 0 ? m + drop : 0);  // relu keeps its output; fc2 its (dropped) input
    case Activation::kGelu:
    case Activation::kGeluTanh: return 2 * m + drop;  // fc1's output (gelu's input), fc2's input
  }
  return 0;
}

}  // namespace

int64_t transformer_layer_kept(const TransformerLayerOptions& o, int64_t batch, int64_t tokens,
                               int64_t context_tokens, const ActivationQuery& q) {
  const int64_t e = element_size(q), d = o.attention.dim, rows = batch * tokens, unit = rows * d * e;
  const int64_t norm = norm_kept(o.norm, rows, d, q), drop = dropout_kept(o.dropout, rows * d, q);
  int64_t bytes = unit;  // the input
  bytes += attention_kept(o.attention, batch, tokens, tokens, q) + drop;
  if (o.norm_first) {
    // norm1's output (q/k/v's input); the residual sum after attention (norm2's or norm_cross's input).
    bytes += norm + unit + unit;
    if (o.cross_attention) {
      AttentionOptions cross = o.attention;
      cross.causal = false;
      bytes += norm + unit + attention_kept(cross, batch, tokens, context_tokens, q) + drop + unit;
    }
    bytes += norm + unit;  // norm2 and its output (the MLP's input)
  } else {
    // Post-norm: the sums before norm1 and norm2, norm1's output (the MLP's input); norm2's output is the next
    // layer's input.
    bytes += unit + norm + unit + unit + norm;
  }
  return bytes + mlp_kept(o, rows, q) + drop;
}

LossBytes cross_entropy_bytes(int64_t rows, int64_t vocab, const ActivationQuery& q) {
  (void)q;
  const int64_t logits32 = rows * vocab * 4;
  // log_softmax keeps its float32 result; backward starts with that result's gradient and the logits' (float32).
  return {logits32, 2 * logits32};
}

}  // namespace shardtrain::models
