// T5's recipe: span corruption (T5's pretraining objective) on text, the encoder reading the corrupted row and the
// decoder writing the hidden spans; and seq2seq fine-tuning on (input, target) records (t5_seq2seq.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "models/activation_model.h"
#include "models/families.h"
#include "models/hf_config.h"
#include "models/kv_cache.h"
#include "models/recipe_helpers.h"
#include "models/t5/t5_seq2seq.h"
#include "models/t5/t5_span_corruption.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/t5.h"

namespace shardtrain::models {

std::pair<std::vector<int64_t>, std::vector<int64_t>> span_corrupt(const std::vector<int64_t>& tokens,
                                                                    int64_t first_sentinel, int64_t eos,
                                                                    std::mt19937_64& rng) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<uint8_t> noise(static_cast<size_t>(n), 0);
  const int64_t masked = std::max<int64_t>(n > 1 ? 1 : 0, std::llround(kSpanNoise * static_cast<double>(n)));
  const int64_t spans = std::max<int64_t>(masked > 0 ? 1 : 0, std::llround(static_cast<double>(masked) / kMeanSpan));
  for (int64_t s = 0, placed = 0; s < spans && placed < masked; ++s) {
    const int64_t length = std::min<int64_t>(masked - placed, std::max<int64_t>(1, masked / spans));
    const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(1, n - length + 1)));
    for (int64_t i = start; i < start + length; ++i) {
      placed += noise[static_cast<size_t>(i)] ? 0 : 1;
      noise[static_cast<size_t>(i)] = 1;
    }
  }
  std::vector<int64_t> input, target;
  int64_t sentinel = first_sentinel;
  for (int64_t i = 0; i < n; ++i) {
    if (!noise[static_cast<size_t>(i)]) {
      input.push_back(tokens[static_cast<size_t>(i)]);
      continue;
    }
    if (i == 0 || !noise[static_cast<size_t>(i - 1)]) {
      input.push_back(sentinel);
      target.push_back(sentinel);
      --sentinel;
    }
    target.push_back(tokens[static_cast<size_t>(i)]);
  }
  input.push_back(eos);
  target.push_back(eos);
  return {input, target};
}

SpanLengths span_corruption_lengths(int64_t width) {
  const int64_t n = std::max<int64_t>(width - 2, 1);
  const int64_t masked = n > 1 ? std::max<int64_t>(1, std::llround(kSpanNoise * static_cast<double>(n))) : 0;
  const int64_t spans = std::max<int64_t>(masked > 0 ? 1 : 0, std::llround(static_cast<double>(masked) / kMeanSpan));
  return {n - masked + spans + 1, masked + spans + 1};
}

namespace {

class T5SpanCorruption : public Task {
 public:
  explicit T5SpanCorruption(const T5Config& config) : config_(config) {}
  std::string name() const override { return "span_corruption"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = 512, d.vocab_size = config_.vocab_size;  // relative positions: 512 is T5's training length
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"span"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t seed) const override {
    // The text's tokens without special ones, closed by the row's EOS (text_rows). The spans depend on (seed,
    // step, micro).
    const TextRows rows = text_rows(b, config_);
    std::vector<std::vector<int64_t>> inputs, targets;
    std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(b.step) * 0x9E3779B97F4A7C15ull) ^
                        static_cast<uint64_t>(b.micro));
    const int64_t sentinel = config_.first_sentinel >= 0 ? config_.first_sentinel : config_.vocab_size - 1;
    for (size_t r = 0; r < rows.eos.size(); ++r) {
      auto [input, target] = span_corrupt(rows.tokens[0][r], sentinel, rows.eos[r], rng);
      inputs.push_back(std::move(input));
      targets.push_back(std::move(target));
    }
    const at::Tensor input_ids = padded_rows(inputs, config_.pad_token_id, b.input_ids.device());
    const at::Tensor mask = (input_ids != config_.pad_token_id).to(at::kLong);
    const at::Tensor labels = padded_rows(targets, kIgnoreIndex, b.input_ids.device());
    Losses out;
    out.total = module_as<T5Impl>(model, "t5").run(input_ids, mask, {}, labels, /*labelled_only=*/true).loss;
    out.parts["span"] = value_of(out.total);
    return out;
  }

 private:
  T5Config config_;
};

nlohmann::json t5_to_hf(const T5Config& c);

// Greedy, sampled or beam-search decoding (generation.h): the encoder once, then the decoder a token a step from the
// start token (the pad token, as transformers' decoder_start_token_id), its self- and cross-attention cached.
class T5Decoder : public TextDecoder {
 public:
  explicit T5Decoder(T5Impl& t5) : t5_(t5), caches_(*t5.decoder) {}
  at::Tensor start(const at::Tensor& ids, const at::Tensor& mask) override {
    encoded_ = t5_.encode(ids, mask), mask_ = mask, position_ = 0;
    return step(sequences_at_start(ids));
  }
  at::Tensor next(const at::Tensor& tokens) override { return step(tokens.view({-1, 1})); }
  void reorder(const at::Tensor& rows) override {
    caches_.reorder(rows);  // cross-attention's keys and values too, alike within a prompt's beams
    const at::Tensor on = rows.to(encoded_.device());
    encoded_ = encoded_.index_select(0, on), mask_ = mask_.index_select(0, on.to(mask_.device()));
  }
  at::Tensor sequences_at_start(const at::Tensor& ids) const override {
    return at::full({ids.size(0), 1}, t5_.config.pad_token_id, ids.options());
  }

 private:
  at::Tensor step(const at::Tensor& tokens) {
    return t5_.decode_step(tokens, position_++, encoded_, mask_).select(1, -1).to(at::kFloat);
  }
  T5Impl& t5_;
  KvCaches caches_;
  at::Tensor encoded_, mask_;  // (B, S, C), (B, S)
  int64_t position_ = 0;       // the decoder's next position
};

class T5Recipe : public FamilyRecipe<T5Config, T5> {
 public:
  using FamilyRecipe::FamilyRecipe;
  std::string hf_config_json() const override { return t5_to_hf(config()).dump(2); }

  // Per sample, with the rows span corruption makes of the batch's T text tokens (enc encoder and dec decoder
  // tokens, span_corruption_lengths), attention width inner = heads * head_dim, attn = 4 d inner weights (q, k, v,
  // o), mlp = 2 d mlp_dim, the L encoder and L decoder blocks:
  //   encoder block  2 (attn + mlp) enc + 4 enc^2 inner
  //   decoder block  2 (attn + mlp) dec + 4 dec^2 inner            (self-attention, MLP)
  //                + 2 (attn / 2) (dec + enc) + 4 dec enc inner    (cross-attention: q, o over dec; k, v over enc)
  // times 3 for training. Exact for span corruption's rows when no two spans meet; a seq2seq batch of the same width
  // is counted as if span-corrupted (its split is in the token values, which the formula does not read).
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor(), b);
    const double d = static_cast<double>(config().dim);
    const double inner = static_cast<double>(config().heads * config().head_dim);
    const double attn = 4 * d * inner, mlp = 2 * d * static_cast<double>(config().mlp_dim);
    const SpanLengths rows = span_corruption_lengths(static_cast<int64_t>(text_tokens(b)));
    const double enc = static_cast<double>(rows.encoder), dec = static_cast<double>(rows.decoder);
    const double encoder = transformer_layer_flops(attn + mlp, enc, inner);
    const double decoder = transformer_layer_flops(attn + mlp, dec, inner) + attn * (dec + enc) + 4 * dec * enc * inner;
    return 3 * static_cast<double>(config().layers) * (encoder + decoder) * batch_rows(b);
  }

  std::vector<std::string> tasks() const override { return {"span_corruption", "seq2seq"}; }
  // The LM head is the shared table both stacks' embeddings read.
  std::vector<std::string> tied_tables() const override { return {"shared.weight"}; }

  std::unique_ptr<TextDecoder> text_decoder(torch::nn::Module& model) const override {
    return std::make_unique<T5Decoder>(module_as<T5Impl>(model, family()));
  }
  // Span corruption's sentinels from the tokenizer's <extra_id_0>, when it has one.
  std::shared_ptr<const ModelRecipe> with_task_head(const std::string&, const TaskSetup& setup) const override {
    if (!setup.first_sentinel || *setup.first_sentinel == config().first_sentinel) return nullptr;
    T5Config c = config();
    c.first_sentinel = *setup.first_sentinel;
    return std::make_shared<T5Recipe>(family(), flavor(), c, t5_names, layer_class());
  }

  // Megatron's split of every encoder and decoder layer (models/tensor_parallel.h; cross-attention by heads, its
  // context whole), each stack's relative position bias by its heads' columns; the shared table (lookups and the
  // tied head) and the final norms whole, so the logits are whole (no sequence parallelism).
  TpPlan tp_plan() const override {
    const T5Config& c = config();
    TpPlan plan = {{"shared", TpStyle::WHOLE}};
    for (const bool decoder : {false, true}) {
      const std::string stack = decoder ? "decoder" : "encoder";
      plan.push_back({stack + ".relative_bias", TpStyle::HEAD_TABLE});
      plan.push_back({stack + ".norm", TpStyle::SEQUENCE});
      for (TpRule& rule : transformer_layer_tp_plan(stack + ".layers.*", t5_layer_options(c, decoder))) {
        plan.push_back(std::move(rule));
      }
    }
    return plan;
  }

  // Span corruption's rows of T text tokens (span_corruption_lengths). Each stack keeps its
  // embedding's dropout noise, its layers (t5_layer_options: the decoder's attend to the encoder's output), its final
  // norm's input and what it keeps, and the noise of the dropout after it; the encoder's output once (every
  // cross-attention's k/v read it), the loss over the decoder's tokens through linear_cross_entropy (every row
  // counted: span corruption labels all but padding). The shared embedding's lookups add their rows into the head's
  // gradient, computed in forward (tie_table()): no table-sized gradient beyond the one. Each stack's position bias,
  // made once for all its layers ((1, H, T, T): span corruption's rows have no padding, which would make the
  // encoder's (B, H, T, T); the decoder's with the future hidden), is the layers' bias; its lookup keeps nothing (the
  // buckets are made again in backward).
  ActivationBytes activation_bytes(const ActivationQuery& q) const override {
    const T5Config& c = config();
    const SpanLengths rows = span_corruption_lengths(q.seq_len > 0 ? q.seq_len : 512);
    const int64_t enc = rows.encoder, dec = rows.decoder, e = element_size(q);
    const int64_t enc_rows = q.batch * enc, dec_rows = q.batch * dec;
    const int64_t enc_unit = enc_rows * c.dim * stream_size(q), dec_unit = dec_rows * c.dim * stream_size(q);
    auto stack_outside = [&](int64_t rows, int64_t unit) {
      return 2 * dropout_kept(c.dropout, rows * c.dim, q) + unit +
             norm_kept(Norm::kRMSNorm, rows, c.dim, q, stream_size(q));
    };
    const LossBytes loss = linear_cross_entropy_bytes(dec_rows, c.vocab_size, c.dim, q);
    ActivationBytes a;
    add_transformer_layers(a, c.layers, t5_layer_options(c, false), q.batch, enc, 0, q);
    add_transformer_layers(a, c.layers, t5_layer_options(c, true), q.batch, dec, enc, q);
    // The encoder's output, the context every decoder layer's k and v read (under autocast its copy, cast once).
    const int64_t context = stream_copies_kept(1, enc_rows * c.dim, q);
    a.outside_layers =
        stack_outside(enc_rows, enc_unit) + context + stack_outside(dec_rows, dec_unit) + loss.kept;
    // (Under tensor parallelism a rank's heads' bias.)
    const int64_t heads = c.heads / std::max<int64_t>(1, q.tp);
    const int64_t enc_bias = heads * enc * enc * e, dec_bias = heads * dec * dec * e;
    a.layer_bias = enc_bias + dec_bias;
    a.bias_saved_by_attention = attention_fused(t5_layer_options(c, false).attention, q);
    // Backward: each stack's bias gathers its gradient from the stack's layers (the encoder's walked last), the sum
    // so far through every moment; a layer's own part is made in attention's backward, over the batch and summed
    // into the bias's shape: the math kernel's scores' gradient (attention's transient already) is it, a fused
    // kernel's an output of its own.
    for (size_t i = 0; i < a.layers.size(); ++i) {
      const int64_t bias = i < static_cast<size_t>(c.layers) ? enc_bias : dec_bias;
      for (BackwardMoment& moment : a.layers[i].backward) moment.transient += bias;
      if (a.bias_saved_by_attention) a.layers[i].backward.back().transient += q.batch * bias;
    }
    a.loss_kept = loss.kept;
    // While the loss runs, also its input: the labelled rows, gathered and scaled (one copy).
    a.loss_transient = loss.forward_transient + dec_rows * c.dim * stream_size(q);
    return a;
  }

  // T5Model: the shared embedding (the encoder's and decoder's embed_tokens are it) and both stacks; the LM head is
  // tied to the shared embedding, so it adds nothing.
  HfModelLayout hf_base_model() const override {
    return {"T5Model", hf_parameters(*T5(config(), meta_build()), hf_names()),
            {"^(encoder|decoder)\\.block\\.\\d+$"}};
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string& name) const override {
    if (name == "seq2seq") return make_t5_seq2seq(config());
    return std::make_unique<T5SpanCorruption>(config());
  }
};

// transformers' T5Config of `c` (T5ForConditionalGeneration; the decoder starts from the pad token, </s> is 1).
nlohmann::json t5_to_hf(const T5Config& c) {
  return {{"model_type", "t5"},
          {"architectures", {"T5ForConditionalGeneration"}},
          {"vocab_size", c.vocab_size},
          {"d_model", c.dim},
          {"d_kv", c.head_dim},
          {"d_ff", c.mlp_dim},
          {"num_layers", c.layers},
          {"num_decoder_layers", c.layers},
          {"num_heads", c.heads},
          {"relative_attention_num_buckets", c.buckets},
          {"relative_attention_max_distance", c.max_distance},
          {"layer_norm_epsilon", c.norm_eps},
          {"dropout_rate", c.dropout},
          {"feed_forward_proj", "relu"},
          {"tie_word_embeddings", true},
          {"is_encoder_decoder", true},
          {"pad_token_id", c.pad_token_id},
          {"decoder_start_token_id", c.pad_token_id},
          {"eos_token_id", c.eos_token_id}};
}

// T5Config's keys: the original T5 (ReLU feed-forward, LM head tied to the embedding, as many decoder blocks as
// encoder blocks). T5 v1.1 / Flan-T5 (gated-gelu, untied head) are not implemented.
T5Config t5_from_hf(const HfConfig& hf) {
  T5Config c;
  c.vocab_size = hf.integer("vocab_size", c.vocab_size);
  c.dim = hf.integer("d_model", c.dim);
  c.head_dim = hf.integer("d_kv", c.head_dim);
  c.mlp_dim = hf.integer("d_ff", c.mlp_dim);
  c.layers = hf.integer("num_layers", c.layers);
  c.heads = hf.integer("num_heads", c.heads);
  c.buckets = hf.integer("relative_attention_num_buckets", c.buckets);
  c.max_distance = hf.integer("relative_attention_max_distance", c.max_distance);
  c.norm_eps = hf.number("layer_norm_epsilon", c.norm_eps);
  c.dropout = hf.number("dropout_rate", c.dropout);
  c.pad_token_id = hf.integer("pad_token_id", c.pad_token_id);
  c.eos_token_id = hf.integer("eos_token_id", c.eos_token_id);
  hf.require("num_decoder_layers", {std::to_string(c.layers)}, "T5 (as many decoder blocks as encoder blocks)");
  hf.require("feed_forward_proj", {"relu"}, "T5");
  hf.require("tie_word_embeddings", {"true"}, "T5 (the LM head tied to the embedding)");
  return c;
}

}  // namespace

ModelFamily t5_family() {
  return {"t5", t5_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<T5Recipe>("t5", f, t5_flavor(f), t5_names, "T5Block");
          },
          "t5",
          [](const HfConfig& hf, const std::string& name) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<T5Recipe>("t5", name, t5_from_hf(hf), t5_names, "T5Block");
          },
          {{"layers", {"num_layers", "num_decoder_layers"}},
           {"dim", {"d_model"}},
           {"head_dim", {"d_kv"}},
           {"heads", {"num_heads"}},
           {"mlp_dim", {"d_ff"}},
           {"vocab_size", {"vocab_size"}},
           {"buckets", {"relative_attention_num_buckets"}},
           {"max_distance", {"relative_attention_max_distance"}},
           {"norm_eps", {"layer_norm_epsilon"}},
           {"dropout", {"dropout_rate"}}}};
}

}  // namespace shardtrain::models
