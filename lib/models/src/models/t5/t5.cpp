#include "shardtrain/models/t5.h"

#include <ATen/ATen.h>

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "models/layer_names.h"
#include "models/unknown_flavor.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"

namespace shardtrain::models {

namespace {

// The (T, S) relative-position buckets of queries first_query .. first_query + T - 1 against keys 0 .. S - 1 (HF's
// _relative_position_bucket): half the buckets for keys after the query when bidirectional; exact distances below
// half of them, logarithmic beyond, up to max_distance.
struct BucketSpan {
  int64_t queries, keys, first_query;
  bool bidirectional;
  int64_t buckets, max_distance;

  std::vector<int64_t> to_ivalues() const {
    return {queries, keys, first_query, bidirectional ? 1 : 0, buckets, max_distance};
  }
  static BucketSpan of(const std::vector<int64_t>& v) { return {v[0], v[1], v[2], v[3] != 0, v[4], v[5]}; }

  at::Tensor make(const at::Device& device) const {
    auto longs = at::TensorOptions().dtype(at::kLong).device(device);
    at::Tensor relative =
        at::arange(keys, longs).unsqueeze(0) - at::arange(first_query, first_query + queries, longs).unsqueeze(1);
    int64_t n = buckets;
    at::Tensor bucket = at::zeros_like(relative);
    at::Tensor distance;
    if (bidirectional) {
      n /= 2;
      bucket = bucket + (relative > 0).to(at::kLong) * n;
      distance = relative.abs();
    } else {
      distance = -at::clamp_max(relative, 0);
    }
    const int64_t max_exact = n / 2;
    at::Tensor large = max_exact + (at::log(distance.to(at::kFloat) / max_exact) /
                                    std::log(static_cast<double>(max_distance) / max_exact) * (n - max_exact))
                                       .to(at::kLong);
    large = at::clamp_max(large, n - 1);
    return bucket + at::where(distance < max_exact, distance, large);
  }
};

// table (buckets, H) -> (T, S, H), its rows at the span's buckets. Backward makes the buckets again rather than
// keeping them: (T, S) int64, 8 MB at 1024 tokens, for every step's whole backward.
struct BucketLookup : public torch::autograd::Function<BucketLookup> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& table,
                            const std::vector<int64_t>& span) {
    ctx->saved_data["span"] = span;
    return at::embedding(table, BucketSpan::of(span).make(table.device()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const BucketSpan span = BucketSpan::of(ctx->saved_data["span"].toIntVector());
    const at::Tensor& grad = grads[0];
    return {at::embedding_dense_backward(grad, span.make(grad.device()), span.buckets, /*padding_idx=*/-1,
                                         /*scale_grad_by_freq=*/false),
            at::Tensor()};
  }
};

}  // namespace

std::vector<std::string> t5_flavors() { return {"t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b", "t5-debug"}; }

T5Config t5_flavor(const std::string& name) {
  T5Config c;  // t5-small
  if (name == "t5-small") return c;
  if (name == "t5-base") {
    c.dim = 768, c.mlp_dim = 3072, c.layers = 12, c.heads = 12;
    return c;
  }
  if (name == "t5-large") {
    c.dim = 1024, c.mlp_dim = 4096, c.layers = 24, c.heads = 16;
    return c;
  }
  if (name == "t5-3b") {
    c.dim = 1024, c.head_dim = 128, c.mlp_dim = 16384, c.layers = 24, c.heads = 32;
    return c;
  }
  if (name == "t5-11b") {
    c.dim = 1024, c.head_dim = 128, c.mlp_dim = 65536, c.layers = 24, c.heads = 128;
    return c;
  }
  if (name == "t5-debug") {
    c.vocab_size = 1000, c.dim = 32, c.head_dim = 8, c.mlp_dim = 64, c.layers = 2, c.heads = 4;
    c.buckets = 8, c.max_distance = 16;
    return c;
  }
  throw_unknown_flavor("T5", name, t5_flavors());
}

TransformerLayerOptions t5_layer_options(const T5Config& c, bool is_decoder) {
  TransformerLayerOptions l;
  l.class_name = "T5Block";
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.head_dim = c.head_dim;
  l.attention.qkv_bias = false, l.attention.out_bias = false, l.attention.scaled = false;
  l.attention.causal = is_decoder, l.attention.dropout = c.dropout;
  l.mlp_dim = c.mlp_dim, l.activation = Activation::kRelu, l.mlp_bias = false;
  l.norm = Norm::kRMSNorm, l.norm_eps = c.norm_eps, l.cross_attention = is_decoder, l.dropout = c.dropout;
  l.mlp_dropout = c.dropout;
  return l;
}

T5StackImpl::T5StackImpl(const T5Config& c, bool is_decoder, const std::string& qualified_name,
                         const BuildOptions& build, std::vector<std::string>& built)
    : config(c), decoder(is_decoder) {
  const auto& t = build.tensors;
  relative_bias = register_module("relative_bias", Embedding(c.buckets, c.heads, t));
  layers = build_layers(*this, "layers", qualified_name + ".layers", c.layers, t5_layer_options(c, is_decoder), build,
                        built);
  norm = register_module("norm", RMSNorm(c.dim, c.norm_eps, t));
}

at::Tensor T5StackImpl::position_bias(int64_t queries, int64_t keys, int64_t first_query) {
  const BucketSpan span{queries, keys, first_query, !decoder, config.buckets, config.max_distance};
  return BucketLookup::apply(relative_bias->weight, span.to_ivalues()).permute({2, 0, 1}).unsqueeze(0);  // (1, H, T, S)
}

at::Tensor T5StackImpl::forward(const at::Tensor& embedded, const at::Tensor& mask, const at::Tensor& encoder_out,
                                const at::Tensor& encoder_mask) {
  const bool train = is_training() && config.dropout > 0;
  at::Tensor x = train ? at::dropout(embedded, config.dropout, true) : embedded;
  const int64_t length = x.size(1);
  const at::ScalarType dtype = attention_dtype(x);
  at::Tensor bias = position_bias(length, length).to(dtype);
  const at::Tensor padding = padding_bias_if_padded(mask, dtype);
  if (padding.defined()) bias = bias + padding;  // (B, H, T, T); (1, H, T, T) without padding
  if (decoder) bias = hide_future(bias, length);  // once for every layer (blocks.h)
  const at::Tensor cross_bias = decoder ? padding_bias_if_padded(encoder_mask, dtype) : at::Tensor();
  // The encoder's output cast once for every layer's cross-attention (under autocast each would keep its own copy).
  const at::Tensor context = decoder ? encoder_out.to(dtype) : at::Tensor();
  x = norm->forward(run_layers(layers, x, bias, {}, context, cross_bias));
  return train ? at::dropout(x, config.dropout, true) : x;
}

at::Tensor T5StackImpl::decode(const at::Tensor& embedded, int64_t position, const at::Tensor& encoder_out,
                               const at::Tensor& encoder_mask) {
  const at::ScalarType dtype = attention_dtype(embedded);
  // One query sees every key so far: no future to hide.
  const at::Tensor bias = position_bias(1, position + 1, position).to(dtype);
  const at::Tensor cross_bias = padding_bias_if_padded(encoder_mask, dtype);
  return norm->forward(run_layers(layers, embedded, bias, {}, encoder_out.to(dtype), cross_bias));
}

T5Impl::T5Impl(const T5Config& c, const BuildOptions& build) : Interceptable("T5"), config(c) {
  shared = register_module("shared", Embedding(c.vocab_size, c.dim, build.tensors));
  std::vector<std::string> built;
  encoder = register_module("encoder", T5Stack(c, false, "encoder", build, built));
  decoder = register_module("decoder", T5Stack(c, true, "decoder", build, built));
  finish_model(build, *this, built);
}

T5Outputs T5Impl::run(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                      const at::Tensor& decoder_input_ids, const at::Tensor& labels, bool labelled_only) {
  return from_tensors<T5Outputs>(forward(input_ids, attention_mask, decoder_input_ids, labels, labelled_only, {}, -1));
}

std::vector<at::Tensor> T5Impl::forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                             const at::Tensor& decoder_input_ids, const at::Tensor& labels,
                                             bool labelled_only, const at::Tensor& encoder_outputs,
                                             int64_t cache_position) {
  // Tied head: the shared embedding, the decoder output rescaled by dim^-1/2 (Mesh TensorFlow's convention).
  const double scale = std::pow(static_cast<double>(config.dim), -0.5);
  if (cache_position >= 0) {
    if (!decoder_input_ids.defined() || decoder_input_ids.size(1) != 1 || !encoder_outputs.defined()) {
      throw std::invalid_argument("T5: a cached decoding step (cache_position " + std::to_string(cache_position) +
                                  ") takes one decoder token a row and the encoder's outputs");
    }
    const at::Tensor decoded =
        decoder->decode(shared->forward(decoder_input_ids), cache_position, encoder_outputs, attention_mask);
    return as_tensors(T5Outputs{at::linear(decoded * scale, shared->weight), at::Tensor(), encoder_outputs});
  }
  if (!decoder_input_ids.defined() && !labels.defined()) {  // the encoder alone
    const at::Tensor encoded = encoder_outputs.defined()
                                   ? encoder_outputs
                                   : encoder->forward(shared->forward(input_ids), attention_mask, {}, {});
    return as_tensors(T5Outputs{at::Tensor(), at::Tensor(), encoded});
  }
  at::Tensor targets_in = decoder_input_ids;
  if (!targets_in.defined()) {
    // Shift right behind the start token (= pad); ignored positions become padding.
    at::Tensor shifted = at::full_like(labels, config.pad_token_id);
    shifted.narrow(1, 1, labels.size(1) - 1).copy_(labels.narrow(1, 0, labels.size(1) - 1));
    targets_in = shifted.masked_fill(shifted == kIgnoreIndex, config.pad_token_id);
  }
  // The head is the shared table: the lookups' rows are added into its dense gradient (tie_table()).
  const bool encoding = !encoder_outputs.defined();
  const TiedTable table = tie_table(shared->weight, encoding ? 2 : 1);
  at::Tensor encoded = encoding ? encoder->forward(sparse_lookup(table.lookups[0], input_ids), attention_mask, {}, {})
                                : encoder_outputs;
  at::Tensor decoded =
      decoder->forward(sparse_lookup(table.lookups.back(), targets_in), {}, encoded, attention_mask);
  if (labelled_only && labels.defined()) {  // no logits: the loss in chunks (linear_cross_entropy)
    LabelledRows labelled = labelled_rows(decoded, labels);
    // Nothing keeps the decoder's output nor the unscaled rows: one (K, C) copy alive while the loss runs.
    decoded = at::Tensor();
    labelled.hidden = labelled.hidden * scale;
    const at::Tensor loss = linear_cross_entropy(labelled.hidden, table.head, {}, labelled.labels);
    return as_tensors(T5Outputs{at::Tensor(), loss, encoded});
  }
  at::Tensor logits = tied_projection(decoded * scale, table.head);
  return as_tensors(T5Outputs{logits, labels.defined() ? masked_cross_entropy(logits, labels) : at::Tensor(), encoded});
}

at::Tensor T5Impl::encode(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  return run(input_ids, attention_mask).encoder_hidden;
}

at::Tensor T5Impl::decode_step(const at::Tensor& tokens, int64_t position, const at::Tensor& encoded,
                               const at::Tensor& attention_mask) {
  if (position < 0) {
    throw std::invalid_argument("T5: decoding position " + std::to_string(position) + " (expected >= 0)");
  }
  return from_tensors<T5Outputs>(forward({}, attention_mask, tokens, {}, false, encoded, position)).logits;
}

NameMap t5_names() {
  NameRules rules = {
      prefix_rule("encoder.relative_bias", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias"),
      prefix_rule("decoder.relative_bias", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias"),
      prefix_rule("encoder.norm", "encoder.final_layer_norm"),
      prefix_rule("decoder.norm", "decoder.final_layer_norm"),
  };
  append(rules, layer_rules("encoder.layers", "encoder.block",
                            {{"attn.q", "layer.0.SelfAttention.q"},
                             {"attn.k", "layer.0.SelfAttention.k"},
                             {"attn.v", "layer.0.SelfAttention.v"},
                             {"attn.o", "layer.0.SelfAttention.o"},
                             {"norm1", "layer.0.layer_norm"},
                             {"norm2", "layer.1.layer_norm"},
                             {"mlp.fc1", "layer.1.DenseReluDense.wi"},
                             {"mlp.fc2", "layer.1.DenseReluDense.wo"}}));
  append(rules, layer_rules("decoder.layers", "decoder.block",
                            {{"attn.q", "layer.0.SelfAttention.q"},
                             {"attn.k", "layer.0.SelfAttention.k"},
                             {"attn.v", "layer.0.SelfAttention.v"},
                             {"attn.o", "layer.0.SelfAttention.o"},
                             {"norm1", "layer.0.layer_norm"},
                             {"cross_attn.q", "layer.1.EncDecAttention.q"},
                             {"cross_attn.k", "layer.1.EncDecAttention.k"},
                             {"cross_attn.v", "layer.1.EncDecAttention.v"},
                             {"cross_attn.o", "layer.1.EncDecAttention.o"},
                             {"norm_cross", "layer.1.layer_norm"},
                             {"norm2", "layer.2.layer_norm"},
                             {"mlp.fc1", "layer.2.DenseReluDense.wi"},
                             {"mlp.fc2", "layer.2.DenseReluDense.wo"}}));
  // Both stacks' embed_tokens and lm_head are the shared embedding.
  return NameMap(rules, {"^(encoder|decoder)\\.embed_tokens\\.weight$", "^lm_head\\.weight$"});
}

}  // namespace shardtrain::models
