#include "shardtrain/models/blocks.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/nn/modules/container/modulelist.h>

#include <limits>
#include <stdexcept>

#include "fused_mlp.h"

namespace shardtrain::models {

namespace {

AttentionOptions completed(AttentionOptions o) {
  if (o.dim <= 0 || o.heads <= 0) {
    throw std::invalid_argument("attention: dim " + std::to_string(o.dim) + " and heads " + std::to_string(o.heads) +
                                " must be positive");
  }
  if (o.kv_heads == 0) o.kv_heads = o.heads;
  if (o.head_dim == 0) {
    if (o.dim % o.heads != 0) {
      throw std::invalid_argument("attention: dim " + std::to_string(o.dim) + " is not a multiple of heads " +
                                  std::to_string(o.heads));
    }
    o.head_dim = o.dim / o.heads;
  }
  if (o.heads % o.kv_heads != 0) {
    throw std::invalid_argument("attention: heads " + std::to_string(o.heads) + " is not a multiple of kv_heads " +
                                std::to_string(o.kv_heads));
  }
  return o;
}

// Hugging Face's rotate_half layout: the two halves of the head dimension are the real and imaginary parts.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& rope) {  // x (B, H, T, D), rope (2, T, D)
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  at::Tensor cos = rope[0].to(x.scalar_type()), sin = rope[1].to(x.scalar_type());
  return x * cos + rotated * sin;
}

torch::nn::AnyModule make_norm(Norm kind, int64_t dim, double eps, const torch::TensorOptions& options) {
  if (kind == Norm::kRMSNorm) return torch::nn::AnyModule(RMSNorm(dim, eps, options));
  return torch::nn::AnyModule(LayerNorm(dim, eps, options));
}

double lowest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return std::numeric_limits<float>::lowest();
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kBFloat16: return -3.3895313892515355e38;  // torch.finfo(torch.bfloat16).min
    case at::kHalf: return -65504.0;
    default: throw std::invalid_argument("attention bias: dtype must be floating point");
  }
}

// A module's input in the dtype its projections compute in, cast once for all of them: under autocast each would
// cast a float32 input itself and keep its own copy for backward. x itself without autocast.
at::Tensor for_projections(const at::Tensor& x) { return x.to(attention_dtype(x)); }

}  // namespace

AttentionImpl::AttentionImpl(const AttentionOptions& opts, const torch::TensorOptions& t) : options(completed(opts)) {
  const int64_t c = options.dim, d = options.head_dim;
  const bool tr = options.transposed;
  if (options.fused_qkv) {
    qkv = register_module("qkv", Linear(c, (options.heads + 2 * options.kv_heads) * d, options.qkv_bias, t, tr));
  } else {
    q = register_module("q", Linear(c, options.heads * d, options.qkv_bias, t, tr));
    k = register_module("k", Linear(c, options.kv_heads * d, options.qkv_bias, t, tr));
    v = register_module("v", Linear(c, options.kv_heads * d, options.qkv_bias, t, tr));
  }
  o = register_module("o", Linear(options.heads * d, c, options.out_bias, t, tr));
  if (options.re_attention) {
    reattn_weights = register_parameter("reattn_weights", at::empty({options.heads, options.heads}, t));
    reattn_norm = register_module("reattn_norm", LayerNorm(options.heads, 1e-5, t));
  }
  if (options.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(d, options.qk_norm_eps, t));
    k_norm = register_module("k_norm", RMSNorm(d, options.qk_norm_eps, t));
  }
}

at::Tensor AttentionImpl::forward_impl(const at::Tensor& x_in, const at::Tensor& context, const at::Tensor& bias,
                                  const at::Tensor& rope) {
  const at::Tensor x = for_projections(x_in);
  // Generating, cross-attention projects its context once: later calls reuse the cached keys and values.
  const bool context_cached = cache != nullptr && context.defined() && cache->keys.defined();
  const at::Tensor source = context.defined() && !context_cached ? for_projections(context) : x;
  const int64_t b = x.size(0), t = x.size(1), s = source.size(1);
  const int64_t h = options.heads, kvh = options.kv_heads, d = options.head_dim;
  at::Tensor qh, kh, vh;
  if (options.fused_qkv) {
    if (context.defined()) throw std::invalid_argument("attention: fused_qkv projects self-attention only");
    const at::Tensor all = qkv->forward(x);  // (B, T, (H + 2 kvH) D): q, k, v side by side, as GPT-2's c_attn
    qh = all.narrow(-1, 0, h * d).view({b, t, h, d});
    kh = all.narrow(-1, h * d, kvh * d).view({b, s, kvh, d});
    vh = all.narrow(-1, (h + kvh) * d, kvh * d).view({b, s, kvh, d});
  } else {
    qh = q->forward(x).view({b, t, h, d});  // (B, T, H, D)
    if (!context_cached) {
      kh = k->forward(source).view({b, s, kvh, d});  // (B, S, kvH, D)
      vh = v->forward(source).view({b, s, kvh, d});
    }
  }
  if (options.qk_norm) qh = q_norm->forward(qh);
  if (options.qk_norm && !context_cached) kh = k_norm->forward(kh);
  qh = qh.transpose(1, 2);  // (B, H, T, D)
  if (!context_cached) kh = kh.transpose(1, 2), vh = vh.transpose(1, 2);  // (B, kvH, S, D)
  if (rope.defined()) {
    qh = apply_rotary(qh, rope);
    if (!context_cached) kh = apply_rotary(kh, rope);
  }
  if (context_cached) {
    kh = cache->keys, vh = cache->values;
  } else if (cache != nullptr) {
    if (!context.defined() && cache->keys.defined()) {
      kh = at::cat({cache->keys, kh}, 2), vh = at::cat({cache->values, vh}, 2);  // (B, kvH, P + T, D)
    }
    cache->keys = kh, cache->values = vh;
  }
  if (options.causal && !bias.defined() && kh.size(2) != t) {
    throw std::invalid_argument("causal attention of " + std::to_string(t) + " queries over " +
                                std::to_string(kh.size(2)) + " keys (some cached): its bias must say which each "
                                "query sees, (..., " + std::to_string(t) + ", " + std::to_string(kh.size(2)) + ")");
  }
  // Generating, the kernel shares each key and value head among its queries itself (enable_gqa): the cache is
  // not copied H / kvH times a step. (Training keeps the repeat: the memory model counts it.)
  const bool shared_heads = kvh != h && cache != nullptr && !options.re_attention;
  if (kvh != h && !shared_heads) {
    kh = kh.repeat_interleave(h / kvh, 1);
    vh = vh.repeat_interleave(h / kvh, 1);
  }
  at::Tensor full_bias = bias.defined() ? bias.to(qh.scalar_type()) : at::Tensor();
  if (options.causal && full_bias.defined() && (full_bias.dim() < 2 || full_bias.size(-2) != t)) {
    throw std::invalid_argument("causal attention over " + std::to_string(t) + " queries: its bias must hide the "
                                "future itself, (..., " + std::to_string(t) + ", S) made with causal_bias or "
                                "hide_future, got sizes " + c10::str(full_bias.sizes()));
  }
  if (options.causal && !full_bias.defined() && options.re_attention) {
    full_bias = causal_bias(t, qh.scalar_type(), qh.device());
  }
  const double scale = options.scaled ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0;
  const double p = is_training() ? options.dropout : 0.0;
  at::Tensor out;  // (B, H, T, D)
  if (options.re_attention) {
    at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) * scale;
    if (full_bias.defined()) scores = scores + full_bias;
    at::Tensor probs = at::softmax(scores, -1);
    probs = at::einsum("bhts,hg->bgts", {probs, reattn_weights});
    probs = reattn_norm->forward(probs.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
    if (p > 0) probs = at::dropout(probs, p, true);
    out = at::matmul(probs, vh);
  } else {
    const bool is_causal = options.causal && !full_bias.defined();
    out = at::scaled_dot_product_attention(qh, kh, vh, full_bias.defined() ? std::optional<at::Tensor>(full_bias)
                                                                           : std::nullopt,
                                           p, is_causal, scale, shared_heads);
  }
  return o->forward(out.transpose(1, 2).reshape({b, t, h * d}));
}

MlpImpl::MlpImpl(int64_t dim, int64_t hidden_dim, Activation act, bool bias, double dropout_,
                 const torch::TensorOptions& t, bool tr)
    : activation(act), dropout(dropout_) {
  if (act == Activation::kSwiGlu) {
    gate = register_module("gate", Linear(dim, hidden_dim, bias, t, tr));
    up = register_module("up", Linear(dim, hidden_dim, bias, t, tr));
    down = register_module("down", Linear(hidden_dim, dim, bias, t, tr));
  } else {
    fc1 = register_module("fc1", Linear(dim, hidden_dim, bias, t, tr));
    fc2 = register_module("fc2", Linear(hidden_dim, dim, bias, t, tr));
  }
}

at::Tensor MlpImpl::forward_impl(const at::Tensor& x_in) {
  const at::Tensor x = for_projections(x_in);
  // Without dropout between them, the activation and the output projection are one node that keeps only the
  // activation's inputs (fused_mlp.h): a (rows, hidden) tensor less per layer with GELU, two with SwiGLU. A LoRA
  // adapter on the output projection joins the node (its A reads the activation there), unless its dropout needs
  // the activation itself.
  LinearImpl* out = down ? down.get() : fc2.get();
  const bool adapted_output = out->has_lora();
  // A float8 output projection computes through its own forward (nn::float8_linear keeps the activation).
  const bool fused = !(dropout > 0 && is_training()) && !(adapted_output && out->lora_dropout > 0 && is_training()) &&
                     !out->float8;
  if (fused && adapted_output && activation != Activation::kRelu) {
    const auto [y, z] = activation == Activation::kSwiGlu
                            ? swiglu_lora_linear(gate->forward(x), up->forward(x), down->matrix(),
                                                 down->bias_in_product(), down->lora_A->weight)
                            : gelu_lora_linear(fc1->forward(x), fc2->matrix(), fc2->bias_in_product(),
                                               fc2->lora_A->weight, activation == Activation::kGeluTanh);
    return out->finish_product(y + at::linear(z, out->lora_B->weight) * out->lora_scale);  // LinearImpl::forward's
  }
  if (fused && !adapted_output) {
    const at::Tensor b = out->bias_in_product();
    switch (activation) {
      case Activation::kSwiGlu:
        return out->finish_product(swiglu_linear(gate->forward(x), up->forward(x), down->matrix(), b));
      case Activation::kGelu: return out->finish_product(gelu_linear(fc1->forward(x), fc2->matrix(), b, false));
      case Activation::kGeluTanh: return out->finish_product(gelu_linear(fc1->forward(x), fc2->matrix(), b, true));
      case Activation::kRelu: break;  // relu's output is what fc2 keeps: nothing to save
    }
  }
  at::Tensor hidden;
  switch (activation) {
    case Activation::kSwiGlu: return down->forward(at::silu(gate->forward(x)) * up->forward(x));
    case Activation::kGelu: hidden = at::gelu(fc1->forward(x)); break;
    case Activation::kGeluTanh: hidden = at::gelu(fc1->forward(x), "tanh"); break;
    case Activation::kRelu: hidden = at::relu(fc1->forward(x)); break;
  }
  if (dropout > 0 && is_training()) hidden = at::dropout(hidden, dropout, true);
  return fc2->forward(hidden);
}

TransformerLayerImpl::TransformerLayerImpl(const TransformerLayerOptions& opts, const torch::TensorOptions& t)
    : Interceptable(opts.class_name), options(opts) {
  const int64_t c = options.attention.dim;
  norm1 = make_norm(options.norm, c, options.norm_eps, t);
  register_module("norm1", norm1.ptr());
  attn = register_module("attn", Attention(options.attention, t));
  if (options.cross_attention) {
    norm_cross = make_norm(options.norm, c, options.norm_eps, t);
    register_module("norm_cross", norm_cross.ptr());
    AttentionOptions cross = options.attention;
    cross.causal = false;
    cross_attn = register_module("cross_attn", Attention(cross, t));
  }
  norm2 = make_norm(options.norm, c, options.norm_eps, t);
  register_module("norm2", norm2.ptr());
  mlp = register_module("mlp", Mlp(c, options.mlp_dim, options.activation, options.mlp_bias, options.mlp_dropout, t,
                                   options.attention.transposed));
}

at::Tensor TransformerLayerImpl::drop(const at::Tensor& x) {
  return options.dropout > 0 && is_training() ? at::dropout(x, options.dropout, true) : x;
}

at::Tensor TransformerLayerImpl::forward_impl(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& rope,
                                              const at::Tensor& context, const at::Tensor& context_bias,
                                              int64_t queries) {
  if (options.cross_attention != context.defined()) {
    throw std::invalid_argument(options.class_name + ": a context is required exactly for cross-attention layers");
  }
  const at::Tensor none;
  if (queries != 0 && queries != x.size(1)) return forward_queries(x, bias, rope, queries);
  if (options.norm_first) {
    at::Tensor h = x + drop(attn->forward(norm1.forward(x), none, bias, rope));
    if (options.cross_attention) h = h + drop(cross_attn->forward(norm_cross.forward(h), context, context_bias, none));
    return h + drop(mlp->forward(norm2.forward(h)));
  }
  at::Tensor h = norm1.forward(x + drop(attn->forward(x, none, bias, rope)));
  if (options.cross_attention) h = norm_cross.forward(h + drop(cross_attn->forward(h, context, context_bias, none)));
  return norm2.forward(h + drop(mlp->forward(h)));
}

// The first `queries` positions attend to all of x: the attention's "context" is the whole (normalized) sequence,
// its queries the leading rows; the residuals, the norm after it and the MLP see those rows only.
at::Tensor TransformerLayerImpl::forward_queries(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& rope,
                                                 int64_t queries) {
  if (queries < 1 || queries > x.size(1) || options.attention.causal || options.cross_attention || rope.defined()) {
    throw std::invalid_argument(options.class_name + ": queries " + std::to_string(queries) +
                                ": expected 0 (all) or 1.." + std::to_string(x.size(1)) +
                                ", in a layer that is neither causal nor rotary nor cross-attending");
  }
  // A bias over (B, H, T, S) keeps the rows of the kept queries; one broadcast over queries (B, 1, 1, S) stays.
  const at::Tensor q_bias = bias.defined() && bias.dim() >= 2 && bias.size(-2) == x.size(1)
                                ? bias.narrow(-2, 0, queries) : bias;
  const at::Tensor xq = x.narrow(1, 0, queries);
  if (options.norm_first) {
    const at::Tensor n = norm1.forward(x);
    at::Tensor h = xq + drop(attn->forward(n.narrow(1, 0, queries), n, q_bias, {}));
    return h + drop(mlp->forward(norm2.forward(h)));
  }
  at::Tensor h = norm1.forward(xq + drop(attn->forward(xq, x, q_bias, {})));
  return norm2.forward(h + drop(mlp->forward(h)));
}

std::vector<TransformerLayer> build_layers(torch::nn::Module& parent, const std::string& name,
                                           const std::string& qualified_prefix, int64_t count,
                                           const TransformerLayerOptions& options, const BuildOptions& build,
                                           std::vector<std::string>& built) {
  std::vector<TransformerLayer> layers;
  if (build.stages.empty()) {
    auto list = parent.register_module(name, torch::nn::ModuleList());
    for (int64_t i = 0; i < count; ++i) {
      layers.emplace_back(options, build.tensors);
      list->push_back(layers.back());
      finish_layer(build, qualified_prefix + "." + std::to_string(i), layers.back().ptr(), built);
    }
    return layers;
  }
  // A ModuleList names its children 0, 1, ...: a stage's layers keep their places in the whole stack instead.
  auto held = parent.register_module(name, std::make_shared<torch::nn::Module>("LayerRuns"));
  int64_t end = 0;
  for (const StageLayers& run : build.stages) {
    if (run.count < 1 || run.first < end || run.first + run.count > count) {
      throw std::invalid_argument("pipeline stage of layers " + std::to_string(run.first) + ".." +
                                  std::to_string(run.first + run.count - 1) + ": expected runs in order within the " +
                                  std::to_string(count) + " layers");
    }
    for (int64_t i = run.first; i < run.first + run.count; ++i) {
      layers.emplace_back(options, build.tensors);
      held->register_module(std::to_string(i), layers.back());
      finish_layer(build, qualified_prefix + "." + std::to_string(i), layers.back().ptr(), built);
    }
    end = run.first + run.count;
  }
  return layers;
}

at::Tensor run_layers(std::vector<TransformerLayer>& layers, at::Tensor x, const at::Tensor& bias,
                      const at::Tensor& rope, const at::Tensor& context, const at::Tensor& context_bias) {
  for (auto& layer : layers) x = layer->forward(x, bias, rope, context, context_bias, 0);
  return x;
}

at::Tensor padding_bias(const at::Tensor& mask, at::ScalarType dtype) {
  if (mask.dim() != 2) {
    throw std::invalid_argument("padding mask must be (batch, length), got " + std::to_string(mask.dim()) + " dims");
  }
  return ((1 - mask.to(dtype)) * lowest(dtype)).view({mask.size(0), 1, 1, mask.size(1)});
}

at::Tensor padding_bias_if_padded(const at::Tensor& mask, at::ScalarType dtype) {
  if (!mask.defined() || (mask.device().is_cpu() && (mask != 0).all().item<bool>())) return {};
  return padding_bias(mask, dtype);
}

at::ScalarType attention_dtype(const at::Tensor& x) {
  const c10::DeviceType device = x.device().type();
  if (x.is_floating_point() && at::autocast::is_autocast_enabled(device)) {
    return at::autocast::get_autocast_dtype(device);
  }
  return x.scalar_type();
}

namespace {

// (T, S) flags for T queries at the last T of S positions, true where a query (row) may not see a key (column):
// the keys after it, and with window > 0 those `window` or more positions before it. One byte an element: what the
// float bias is made from.
at::Tensor hidden_keys(int64_t queries, int64_t keys, int64_t window, const at::Device& device) {
  const auto flags = at::TensorOptions().dtype(at::kBool).device(device);
  const int64_t past = keys - queries;  // query i is at position past + i
  at::Tensor hidden = at::ones({queries, keys}, flags).triu_(past + 1);
  if (window > 0) hidden.logical_or_(at::ones({queries, keys}, flags).tril_(past - window));
  return hidden;
}

}  // namespace

at::Tensor causal_bias(int64_t length, at::ScalarType dtype, const at::Device& device, int64_t window) {
  return at::zeros({1, 1, length, length}, at::TensorOptions().dtype(dtype).device(device))
      .masked_fill_(hidden_keys(length, length, window, device), lowest(dtype));
}

at::Tensor hide_future(const at::Tensor& bias, int64_t length, int64_t window) {
  return at::where(hidden_keys(length, length, window, bias.device()), lowest(bias.scalar_type()), bias);
}

at::Tensor rotary_inv_freq(int64_t head_dim, double theta, const at::Device& device) {
  auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
  return 1.0 / at::pow(theta, at::arange(0, head_dim, 2, i64).to(at::kFloat) / static_cast<double>(head_dim));
}

at::Tensor rotary_table(int64_t length, const at::Tensor& inv_freq) {
  at::Tensor angles = at::outer(at::arange(length, inv_freq.options()), inv_freq);  // (T, D/2)
  at::Tensor full = at::cat({angles, angles}, -1);                    // (T, D)
  return at::stack({full.cos(), full.sin()});
}

at::Tensor rotary_at(const at::Tensor& positions, const at::Tensor& inv_freq) {
  const at::Tensor angles = positions.to(inv_freq.scalar_type()).unsqueeze(-1) * inv_freq;  // (B, T, D/2)
  const at::Tensor full = at::cat({angles, angles}, -1).unsqueeze(1);                     // (B, 1, T, D)
  return at::stack({full.cos(), full.sin()});
}

at::Tensor decode_bias(const at::Tensor& mask, int64_t queries, int64_t window, at::ScalarType dtype) {
  const at::Tensor hidden = hidden_keys(queries, mask.size(1), window, mask.device())
                                .unsqueeze(0)
                                .logical_or((mask == 0).unsqueeze(1))
                                .unsqueeze(1);  // (B, 1, T, S)
  return at::zeros(hidden.sizes(), mask.options().dtype(dtype)).masked_fill_(hidden, lowest(dtype));
}

}  // namespace shardtrain::models
