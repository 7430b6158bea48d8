#include "shardtrain/models/llama.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "models/layer_names.h"
#include "models/causal_lm.h"
#include "models/unknown_flavor.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"

namespace shardtrain::models {

std::vector<std::string> llama_flavors() {
  return {"llama-3-8b",  "llama-3.1-8b", "llama-3.2-1b", "llama-3.2-3b",
          "llama-3-70b", "llama-2-7b",   "llama-debug",  "llama-3.2-debug"};
}

std::vector<std::string> mistral_flavors() { return {"mistral-7b", "mistral-7b-v0.3", "mistral-debug"}; }

std::vector<std::string> qwen2_flavors() { return {"qwen2.5-0.5b", "qwen2.5-7b", "qwen2-debug"}; }

std::vector<std::string> qwen3_flavors() { return {"qwen3-0.6b", "qwen3-8b", "qwen3-debug"}; }

namespace {

// Mistral 7B (v0.1: a 4096-token sliding window; v0.3: none, a 32768-token vocabulary), mistral-debug (a window of
// 8 tokens).
LlamaConfig mistral_flavor(const std::string& name) {
  LlamaConfig c;
  c.model_type = "mistral";
  c.vocab_size = 32000, c.dim = 4096, c.layers = 32, c.heads = 32, c.kv_heads = 8, c.mlp_dim = 14336;
  c.max_positions = 32768, c.rope_theta = 10000.0, c.sliding_window = 4096;
  if (name == "mistral-7b") return c;
  if (name == "mistral-7b-v0.3") {
    c.vocab_size = 32768, c.rope_theta = 1e6, c.sliding_window = 0;
    return c;
  }
  if (name == "mistral-debug") {
    c.vocab_size = 1000, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.mlp_dim = 128;
    c.max_positions = 128, c.sliding_window = 8;
    return c;
  }
  throw_unknown_flavor("Mistral", name, mistral_flavors());
}

// Qwen2.5 0.5B (its head tied) and 7B, qwen2-debug (tied): biases on q, k and v, RMSNorm's epsilon 1e-6.
LlamaConfig qwen2_flavor(const std::string& name) {
  LlamaConfig c;
  c.model_type = "qwen2";
  c.qkv_bias = true, c.norm_eps = 1e-6, c.rope_theta = 1e6;
  if (name == "qwen2.5-0.5b") {
    c.vocab_size = 151936, c.dim = 896, c.layers = 24, c.heads = 14, c.kv_heads = 2, c.mlp_dim = 4864;
    c.max_positions = 32768, c.tie_word_embeddings = true;
    return c;
  }
  if (name == "qwen2.5-7b") {
    c.vocab_size = 152064, c.dim = 3584, c.layers = 28, c.heads = 28, c.kv_heads = 4, c.mlp_dim = 18944;
    c.max_positions = 131072;
    return c;
  }
  if (name == "qwen2-debug") {
    c.vocab_size = 1000, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.mlp_dim = 128;
    c.max_positions = 128, c.tie_word_embeddings = true;
    return c;
  }
  throw_unknown_flavor("Qwen2", name, qwen2_flavors());
}

// Qwen3 0.6B (its head tied) and 8B, qwen3-debug (tied, heads of 32 for a width of 64 over 4 heads): q_norm and
// k_norm, heads of 128 wider than hidden_size / heads, no biases.
LlamaConfig qwen3_flavor(const std::string& name) {
  LlamaConfig c;
  c.model_type = "qwen3";
  c.qk_norm = true, c.head_dim = 128, c.norm_eps = 1e-6, c.rope_theta = 1e6, c.max_positions = 40960;
  c.vocab_size = 151936, c.kv_heads = 8;
  if (name == "qwen3-0.6b") {
    c.dim = 1024, c.layers = 28, c.heads = 16, c.mlp_dim = 3072, c.tie_word_embeddings = true;
    return c;
  }
  if (name == "qwen3-8b") {
    c.dim = 4096, c.layers = 36, c.heads = 32, c.mlp_dim = 12288;
    return c;
  }
  if (name == "qwen3-debug") {
    c.vocab_size = 1000, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.mlp_dim = 128;
    c.max_positions = 128, c.tie_word_embeddings = true;
    return c;
  }
  throw_unknown_flavor("Qwen3", name, qwen3_flavors());
}

}  // namespace

std::string llama_hf_class_prefix(const std::string& model_type) {
  if (model_type == "mistral") return "Mistral";
  if (model_type == "qwen2") return "Qwen2";
  if (model_type == "qwen3") return "Qwen3";
  return "Llama";
}

std::string llama_layer_class(const LlamaConfig& c) { return llama_hf_class_prefix(c.model_type) + "DecoderLayer"; }

LlamaConfig llama_flavor(const std::string& name) {
  if (name.rfind("mistral", 0) == 0) return mistral_flavor(name);
  if (name.rfind("qwen2", 0) == 0) return qwen2_flavor(name);
  if (name.rfind("qwen3", 0) == 0) return qwen3_flavor(name);
  LlamaConfig c;  // llama-3-8b (Meta-Llama-3-8B)
  if (name == "llama-3-8b") return c;
  // Llama 3.1 and 3.2: 128K positions through "llama3" RoPE scaling of the 8K pretraining context; 3.2's small
  // models tie the head to the embedding.
  LlamaRopeScaling llama3;
  llama3.type = "llama3", llama3.factor = 8, llama3.low_freq_factor = 1, llama3.high_freq_factor = 4;
  llama3.original_max_positions = 8192;
  if (name == "llama-3.1-8b") {
    c.max_positions = 131072, c.rope_scaling = llama3;
    return c;
  }
  if (name == "llama-3.2-1b" || name == "llama-3.2-3b") {
    const bool small = name == "llama-3.2-1b";
    c.dim = small ? 2048 : 3072, c.layers = small ? 16 : 28, c.heads = small ? 32 : 24, c.kv_heads = 8;
    c.head_dim = small ? 64 : 128, c.mlp_dim = 8192, c.max_positions = 131072;
    c.rope_scaling = llama3, c.rope_scaling.factor = 32, c.tie_word_embeddings = true;
    return c;
  }
  if (name == "llama-3-70b") {
    c.dim = 8192, c.layers = 80, c.heads = 64, c.kv_heads = 8, c.mlp_dim = 28672;
    return c;
  }
  if (name == "llama-2-7b") {
    c.vocab_size = 32000, c.dim = 4096, c.layers = 32, c.heads = 32, c.kv_heads = 32, c.mlp_dim = 11008;
    c.max_positions = 4096, c.rope_theta = 10000.0;
    return c;
  }
  if (name == "llama-debug" || name == "llama-3.2-debug") {
    c.vocab_size = 1000, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.mlp_dim = 128;
    c.max_positions = 128, c.rope_theta = 10000.0;
    if (name == "llama-debug") return c;
    // Llama 3.2's shape at that size: a tied head, heads of 32 (not 64 / 4), "llama3" RoPE scaling of a 64-token
    // context (of the 16 frequencies the two fastest kept, one interpolated, the rest scaled).
    c.head_dim = 32, c.rope_theta = 500000.0, c.tie_word_embeddings = true;
    c.rope_scaling = llama3, c.rope_scaling.original_max_positions = 64;
    return c;
  }
  throw_unknown_flavor("Llama", name, llama_flavors());
}

TransformerLayerOptions llama_layer_options(const LlamaConfig& c) {
  TransformerLayerOptions l;
  l.class_name = llama_layer_class(c);
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.kv_heads = c.kv_heads;
  l.attention.head_dim = c.head_size();
  l.attention.qkv_bias = c.qkv_bias, l.attention.out_bias = c.out_bias, l.attention.causal = true;
  l.attention.qk_norm = c.qk_norm, l.attention.qk_norm_eps = c.norm_eps;
  l.mlp_dim = c.mlp_dim, l.activation = Activation::kSwiGlu, l.mlp_bias = c.mlp_bias;
  l.norm = Norm::kRMSNorm, l.norm_eps = c.norm_eps;
  return l;
}

// transformers' _compute_default / _linear_scaling / _llama3_parameters, operation for operation in float32
// (Python's `number / tensor` is reciprocal(tensor) * number).
at::Tensor llama_inv_freq(const LlamaConfig& c, const at::Device& device) {
  const at::Tensor inv_freq = rotary_inv_freq(c.head_size(), c.rope_theta, device);
  const LlamaRopeScaling& r = c.rope_scaling;
  if (r.type == "default") return inv_freq;
  if (r.type == "linear") return inv_freq / r.factor;
  if (r.type != "llama3") {
    throw std::invalid_argument("Llama: rope scaling '" + r.type + "' is not one of default, linear, llama3");
  }
  const double old_context = static_cast<double>(r.original_max_positions);
  const double low_freq_wavelen = old_context / r.low_freq_factor, high_freq_wavelen = old_context / r.high_freq_factor;
  const at::Tensor wavelen = at::reciprocal(inv_freq) * (2 * M_PI);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth =
      (at::reciprocal(wavelen) * old_context - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const at::Tensor medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
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
  const VocabShard* shard = vocab_shard ? &*vocab_shard : nullptr;
  if (!targets.defined()) {
    const at::Tensor logits = at::linear(hidden, weight);
    return {shard != nullptr ? gather_vocabulary(logits, *shard) : logits};
  }
  return {linear_cross_entropy(hidden, weight, at::Tensor(), targets, shard)};
}

std::string LlamaConfig::pipeline_stages_refused() const {
  if (tied_head()) return "its head is tied to its embedding (one table at both ends of the stack)";
  if (classifier.enabled()) return "a sequence classifier's stages are not written yet";
  return "";
}

LlamaImpl::LlamaImpl(const LlamaConfig& c, const BuildOptions& build)
    : Interceptable("Llama"), config(c), stages(build.stages) {
  const auto& t = build.tensors;
  if (!stages.empty()) {
    if (const std::string why = c.pipeline_stages_refused(); !why.empty()) {
      throw std::invalid_argument("Llama: no pipeline stages: " + why);
    }
  }
  const bool first = stages.empty() || stages.front().first == 0;
  const bool last = stages.empty() || stages.back().first + stages.back().count == c.layers;
  if (c.tied_head()) {
    tied_embed = register_module("embed", Embedding(c.vocab_size, c.dim, t));
  } else if (first) {
    embed = register_module("embed", LlamaEmbedding(c.vocab_size, c.dim, t));
  }
  std::vector<std::string> built;
  layers = build_layers(*this, "layers", "layers", c.layers, llama_layer_options(c), build, built);
  if (last) norm = register_module("norm", RMSNorm(c.dim, c.norm_eps, t));
  if (c.classifier.enabled()) {
    score = register_module("score", Linear(c.dim, c.classifier.classes(), /*bias=*/false, t));
  } else if (!c.tied_head() && last) {
    lm_head = register_module("lm_head", LlamaLMHead(c.dim, c.vocab_size, t));
  }
  finish_model(build, *this, built);
}

LlamaOutputs LlamaImpl::run(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& labels,
                            bool labelled_only, const at::Tensor& position_ids) {
  return from_tensors<CausalLmOutputs>(forward(input_ids, attention_mask, labels, labelled_only, position_ids));
}

std::vector<at::Tensor> LlamaImpl::forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                const at::Tensor& labels, bool labelled_only,
                                                const at::Tensor& position_ids) {
  if (!stages.empty()) return {run_stage(input_ids, attention_mask, labels)};
  const int64_t length = input_ids.size(1);
  const bool decoding = position_ids.defined();
  const int64_t positions = decoding && attention_mask.defined() ? attention_mask.size(1) : length;
  if (positions > config.max_positions) {
    throw std::invalid_argument("Llama: " + std::to_string(positions) + " tokens exceed max_positions " +
                                std::to_string(config.max_positions));
  }
  const bool tied = config.tied_head();
  const std::optional<TokenTable> table = tied ? std::optional<TokenTable>(std::in_place, *tied_embed, true)
                                               : std::nullopt;
  const at::Tensor x = tied ? table->lookup(input_ids) : embed->forward(input_ids);
  auto head = [&](const at::Tensor& h, const at::Tensor& targets) {
    return tied ? table->head(h, targets) : lm_head->forward(h, targets)[0];
  };
  const at::Tensor inv_freq = llama_inv_freq(config, x.device());
  // Mistral's window, where it cuts; the bias made once for every layer (blocks.h).
  const int64_t window = config.sliding_window > 0 && length > config.sliding_window ? config.sliding_window : 0;
  if (config.classifier.enabled()) {
    if (decoding) throw std::invalid_argument("Llama: a sequence classifier does not decode");
    const CausalLmStart start =
        causal_classifier_start(attention_mask, length, window, attention_dtype(x), x.device());
    const at::Tensor h = norm->forward(run_layers(layers, x, start.bias, rotary_table(length, inv_freq)));
    const at::Tensor logits = score->forward(last_token_rows(h, attention_mask));
    return as_tensors(CausalLmOutputs{logits, labels.defined() ? classifier_loss(logits, labels) : at::Tensor()});
  }
  if (decoding) {
    const at::Tensor bias = causal_lm_decode_bias(input_ids, attention_mask, config.sliding_window, attention_dtype(x));
    const at::Tensor h = norm->forward(run_layers(layers, x, bias, rotary_at(position_ids, inv_freq)));
    return as_tensors(CausalLmOutputs{head(h.narrow(1, length - 1, 1), {}), at::Tensor()});
  }
  const CausalLmStart start =
      causal_lm_start(attention_mask, labels, labelled_only, length, window, attention_dtype(x), x.device());
  const at::Tensor rope = rotary_table(length, inv_freq);
  return as_tensors(causal_lm_outputs(norm->forward(run_layers(layers, x, start.bias, rope)), start, labels, head));
}

at::Tensor LlamaImpl::run_stage(const at::Tensor& x, const at::Tensor& attention_mask, const at::Tensor& labels) {
  if (stage_to_run < 0 || stage_to_run >= static_cast<int64_t>(stages.size())) {
    throw std::invalid_argument("Llama: stage_to_run " + std::to_string(stage_to_run) + " of the " +
                                std::to_string(stages.size()) + " stages this model holds");
  }
  int64_t offset = 0;  // the run's first layer in `layers`, which holds the runs one after another
  for (int64_t s = 0; s < stage_to_run; ++s) offset += stages[static_cast<size_t>(s)].count;
  const StageLayers& run = stages[static_cast<size_t>(stage_to_run)];
  const at::Tensor hidden = run.first == 0 ? embed->forward(x) : x;
  // The tokens (T): under sequence parallelism the stream between stages is a rank's slice (B, T / tp, C).
  const int64_t length = labels.defined()           ? labels.size(1)
                         : attention_mask.defined() ? attention_mask.size(1)
                                                    : x.size(1);
  const int64_t window = config.sliding_window > 0 && length > config.sliding_window ? config.sliding_window : 0;
  // The attention bias as the whole model's forward decides it (from the labels too), on every stage alike.
  const CausalLmStart start = causal_lm_start(attention_mask, labels, /*labelled_only=*/true, length, window,
                                              attention_dtype(hidden), hidden.device());
  std::vector<TransformerLayer> mine(layers.begin() + offset, layers.begin() + offset + run.count);
  at::Tensor h = run_layers(mine, hidden, start.bias, rotary_table(length, llama_inv_freq(config, hidden.device())));
  if (run.first + run.count < config.layers) return h;
  auto head = [&](const at::Tensor& rows, const at::Tensor& targets) { return lm_head->forward(rows, targets)[0]; };
  return causal_lm_outputs(norm->forward(h), start, labels, head).loss;
}

namespace {

NameRules llama_rules() {
  NameRules rules = {prefix_rule("embed", "model.embed_tokens"), prefix_rule("norm", "model.norm")};
  append(rules, layer_rules("layers", "model.layers",
                            {{"attn.q", "self_attn.q_proj"},
                             {"attn.k", "self_attn.k_proj"},
                             {"attn.v", "self_attn.v_proj"},
                             {"attn.o", "self_attn.o_proj"},
                             {"attn.q_norm", "self_attn.q_norm"},  // Qwen3's
                             {"attn.k_norm", "self_attn.k_norm"},
                             {"norm1", "input_layernorm"},
                             {"norm2", "post_attention_layernorm"},
                             {"mlp.gate", "mlp.gate_proj"},
                             {"mlp.up", "mlp.up_proj"},
                             {"mlp.down", "mlp.down_proj"}}));
  return rules;
}

const char kRotaryBuffer[] = "^model\\.layers\\.\\d+\\.self_attn\\.rotary_emb\\.inv_freq$";

}  // namespace

NameMap llama_names() {
  // A tied model has no lm_head; a file that keeps the tied copy anyway has it under lm_head.weight. A causal LM's
  // file has no score: a classifier fine-tuned from it starts with score initialized (reported).
  return NameMap(llama_rules(), {kRotaryBuffer, "^lm_head\\.weight$"}, {}, {"^score\\.weight$"});
}

NameMap llama_classifier_names() {
  // A causal LM's head, which the classifier has no use for, is reported unused (as transformers does).
  return NameMap(llama_rules(), {kRotaryBuffer}, {}, {"^score\\.weight$", "^lm_head\\.weight$"});
}

}  // namespace shardtrain::models
