// Llama's recipe: causal language modelling (LlamaForCausalLM) on text, padding left out of the loss; evaluated by
// the loss per token and perplexity on data.eval's text. Or sequence classification (LlamaForSequenceClassification)
// on each text's last token, evaluated by accuracy and F1. Mistral's, Qwen2's and Qwen3's the same.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "models/activation_model.h"
#include "models/causal_lm.h"
#include "models/families.h"
#include "models/hf_config.h"
#include "models/recipe_helpers.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/llama.h"

namespace shardtrain::models {
namespace {

nlohmann::json llama_to_hf(const LlamaConfig& c);

class LlamaRecipe : public FamilyRecipe<LlamaConfig, Llama> {
 public:
  using FamilyRecipe::FamilyRecipe;
  std::string hf_config_json() const override { return llama_to_hf(config()).dump(2); }
  NameMap hf_names() const override {
    return config().classifier.enabled() ? llama_classifier_names() : llama_names();
  }

  // Per sample, for T tokens of width d through L layers, with grouped-query attention (a = heads * head_dim wide
  // queries, kv = kv_heads * head_dim wide keys and values: q and o are d x a, k and v d x kv) and the gated MLP's
  // three d x mlp_dim matrices:
  //   3 * L * (2 * (2 d a + 2 d kv + 3 d mlp_dim) * T + 4 T^2 a)   (embeddings and lm_head left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor(), b);
    const LlamaConfig& c = config();
    const double d = static_cast<double>(c.dim), head = static_cast<double>(c.head_size());
    const double a = head * static_cast<double>(c.heads), kv = head * static_cast<double>(c.kv_heads);
    const double weights = 2 * d * a + 2 * d * kv + 3 * d * static_cast<double>(c.mlp_dim);
    const double layers = static_cast<double>(c.layers);
    return 3 * layers * transformer_layer_flops(weights, text_tokens(b), a) * batch_rows(b);
  }

  // A classifier's config (...ForSequenceClassification) classifies by default. classify: score over setup.labels
  // (else the config's own classes) in place of the LM head, as transformers' AutoModelForSequenceClassification
  // builds on a causal LM's config; causal_lm: the LM head.
  std::vector<std::string> tasks() const override { return causal_lm_tasks(config().classifier); }
  std::shared_ptr<const ModelRecipe> with_task_head(const std::string& task, const TaskSetup& setup) const override {
    const auto classifier = classifier_for_task(task, setup, config().classifier, flavor());
    if (!classifier) return nullptr;
    LlamaConfig c = config();
    c.classifier = *classifier;
    return std::make_shared<LlamaRecipe>(family(), flavor(), c, llama_names, layer_class());
  }

  std::unique_ptr<TextDecoder> text_decoder(torch::nn::Module& model) const override {
    if (config().classifier.enabled()) {
      refuse_to_generate(flavor(), llama_hf_class_prefix(config().model_type) + "ForSequenceClassification");
    }
    LlamaImpl& llama = module_as<LlamaImpl>(model, family());
    return causal_lm_decoder(model, [&llama](const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& at) {
      return llama.run(ids, mask, {}, false, at).logits;
    });
  }

  // Untied: the embedding and the head, each vocab x dim, are units of their own (recipe.h). Tied: one table,
  // read at both ends of the model, stays in the root.
  // A classifier's score, (classes, dim), stays in the root.
  EdgeUnits edge_unit_classes() const override {
    if (config().tied_head()) return {};
    return {"LlamaEmbedding", config().classifier.enabled() ? "" : "LlamaLMHead"};
  }
  std::vector<std::string> tied_tables() const override {
    if (!config().tied_head()) return {};
    return {"embed.weight"};
  }
  std::string pipeline_stages_refused() const override { return config().pipeline_stages_refused(); }

  // Megatron's split as torchtitan's Llama plan (models/tensor_parallel.h): the embedding and the head by
  // vocabulary rows, q, k, v, gate and up column-wise, o and down row-wise, the norms on the sequence slice under
  // sequence parallelism, the final one's output gathered for the head. Qwen3's per-head norms see this rank's heads.
  // A table tied to the head (Llama 3.2 1B/3B, Qwen's small ones) is split by rows too, for both.
  TpPlan tp_plan() const override {
    const LlamaConfig& c = config();
    TpPlan plan = {{"embed", c.tied_head() ? TpStyle::VOCAB_TABLE : TpStyle::VOCAB_EMBEDDING},
                   {"norm", TpStyle::SEQUENCE_GATHER}};
    for (TpRule& rule : transformer_layer_tp_plan("layers.*", llama_layer_options(c))) {
      plan.push_back(std::move(rule));
    }
    if (c.qk_norm) {
      plan.push_back({"layers.*.attn.q_norm", TpStyle::HEAD_LOCAL});
      plan.push_back({"layers.*.attn.k_norm", TpStyle::HEAD_LOCAL});
    }
    if (c.classifier.enabled()) plan.push_back({"score", TpStyle::WHOLE});
    if (!c.classifier.enabled() && !c.tied_head()) plan.push_back({"lm_head", TpStyle::VOCAB_HEAD});
    return plan;
  }

  // Layers: llama_layer_options (the embedding's output is layer 0's input; under sequence parallelism, as the
  // final norm's input and what it keeps, a rank's slice of the sequence). Then the final norm (its input and
  // what it keeps) and the loss through linear_cross_entropy at the positions that predict a label (every position
  // counted: all but a row's last, and padding, predict one): linear_cross_entropy_bytes. Mistral's window, where
  // it cuts, is a (1, 1, T, T) bias all layers read (right padding needs none: llama.cpp).
  // A classifier: the final norm over every token, then its output's last rows (B, dim: the score's input, a
  // copy) and the loss over one row per sample.
  ActivationBytes activation_bytes(const ActivationQuery& q) const override {
    const LlamaConfig& c = config();
    const int64_t T = q.seq_len > 0 ? q.seq_len : c.max_positions, N = q.batch * T, e = element_size(q);
    const int64_t unit = stream_rows(N, q) * c.dim * stream_size(q);
    ActivationBytes a;
    const TransformerLayerOptions layer = llama_layer_options(c);
    add_transformer_layers(a, c.layers, layer, q.batch, T, 0, q);
    a.layer_bias = c.sliding_window > 0 && T > c.sliding_window ? T * T * e : 0;
    a.bias_saved_by_attention = attention_fused(layer.attention, q);
    a.outside_layers = unit + norm_kept(Norm::kRMSNorm, stream_rows(N, q), c.dim, q, stream_size(q));
    if (c.classifier.enabled()) {
      add_last_token_classifier(a, q.batch, c.dim, c.classifier.classes(), q);
      return a;
    }
    // Under tensor parallelism over this rank's rows of the vocabulary (the loss over split logits).
    const LossBytes loss = linear_cross_entropy_bytes(N, tp_part(c.vocab_size, q), c.dim, q);
    a.outside_layers += loss.kept;
    // While the loss runs, also its input: the labelled rows, gathered (labelled_rows: a copy).
    a.loss_transient = loss.forward_transient + N * c.dim * stream_size(q);
    a.loss_kept = loss.kept;
    return a;
  }

  // LlamaModel (MistralModel, Qwen2Model, Qwen3Model): no LM head. Its rotary embedding holds the inverse
  // frequencies, and (transformers 5) their original values, as float32 buffers of head_dim / 2.
  HfModelLayout hf_base_model() const override {
    const std::string base = llama_hf_class_prefix(config().model_type) + "Model";
    HfModelLayout out{base, hf_parameters(*Llama(config(), meta_build()), hf_names(), "model."),
                      {"^layers\\.\\d+$"}};
    const int64_t half = config().head_size() / 2;
    for (const char* f : {"rotary_emb.inv_freq", "rotary_emb.original_inv_freq"}) {
      out.tensors.push_back({f, {half}, at::kFloat, true});
    }
    return out;
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string& name) const override {
    const LlamaConfig& c = config();
    return causal_lm_task<LlamaImpl>(name, "llama", flavor(), c.max_positions, c.vocab_size, c.classifier);
  }
};

// transformers' LlamaConfig, MistralConfig, Qwen2Config or Qwen3Config of `c` (for ...ForCausalLM; rope_theta and
// rope_scaling at the top, which transformers 4 and 5 both read; head_dim when it is not hidden_size /
// num_attention_heads, and always for Qwen3, whose config defaults it to 128). Biases as each family's keys say
// them: Llama's attention_bias (q, k, v and o) and mlp_bias, Qwen3's attention_bias, Qwen2's q, k and v always;
// Mistral has none.
nlohmann::json llama_to_hf(const LlamaConfig& c) {
  const char* head = c.classifier.enabled() ? "ForSequenceClassification" : "ForCausalLM";
  nlohmann::json j = {{"model_type", c.model_type},
                      {"architectures", {llama_hf_class_prefix(c.model_type) + head}},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.dim},
                      {"intermediate_size", c.mlp_dim},
                      {"num_hidden_layers", c.layers},
                      {"num_attention_heads", c.heads},
                      {"num_key_value_heads", c.kv_heads},
                      {"max_position_embeddings", c.max_positions},
                      {"rms_norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", c.tie_word_embeddings}};
  if (c.model_type == "llama" || c.model_type == "qwen3") j["attention_bias"] = c.qkv_bias;
  if (c.model_type == "llama") j["mlp_bias"] = c.mlp_bias;
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3") j["use_sliding_window"] = false;
  if ((c.head_dim > 0 && c.head_dim != c.dim / c.heads) || c.model_type == "qwen3") j["head_dim"] = c.head_size();
  hf_put_classifier(j, c.classifier);
  const LlamaRopeScaling& r = c.rope_scaling;
  if (r.type == "linear") j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
  if (r.type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_positions}};
  }
  return j;
}

// RoPE's scaling from rope_scaling (transformers 4: "rope_type", or "type" in older files) or rope_parameters
// (transformers 5, which also holds rope_theta there). "dynamic", "yarn", "longrope" and the rest are refused:
// they change with the sequence length or scale attention too.
LlamaRopeScaling rope_scaling_from_hf(const HfConfig& hf, int64_t max_positions) {
  const HfConfig scaling = hf.has("rope_scaling") ? hf.section("rope_scaling") : hf.section("rope_parameters");
  LlamaRopeScaling r;
  r.type = scaling.text("rope_type", scaling.text("type", "default"));
  scaling.require("rope_type", {"default", "linear", "llama3"}, "Llama (RoPE scaling)");
  scaling.require("type", {"default", "linear", "llama3"}, "Llama (RoPE scaling)");
  scaling.require("partial_rotary_factor", {"1", "1.0"}, "Llama (rotary embedding over the whole head)");
  if (r.type == "default") return r;
  r.factor = scaling.number("factor", 0);
  if (!(r.factor >= 1)) scaling.reject("factor", "expected a number of at least 1 for " + r.type + " RoPE scaling");
  if (r.type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!scaling.has(key)) scaling.reject(key, "llama3 RoPE scaling needs a number there");
    }
    r.low_freq_factor = scaling.number("low_freq_factor", 0);
    r.high_freq_factor = scaling.number("high_freq_factor", 0);
    r.original_max_positions = scaling.integer("original_max_position_embeddings", max_positions);
    if (!(r.low_freq_factor > 0)) scaling.reject("low_freq_factor", "expected a positive number");
    if (!(r.high_freq_factor > r.low_freq_factor)) {
      scaling.reject("high_freq_factor", "expected more than low_freq_factor (" + std::to_string(r.low_freq_factor) +
                                             ")");
    }
  }
  return r;
}

// The keys of LlamaConfig, MistralConfig, Qwen2Config or Qwen3Config (`model_type`; transformers 4 and 5:
// rope_theta at the top or in rope_parameters; where a key is absent, transformers' default for theta and the
// norm's epsilon).
LlamaConfig llama_from_hf(const HfConfig& hf, const std::string& model_type) {
  LlamaConfig c;
  c.model_type = model_type;
  c.vocab_size = hf.integer("vocab_size", c.vocab_size);
  c.dim = hf.integer("hidden_size", c.dim);
  c.layers = hf.integer("num_hidden_layers", c.layers);
  c.heads = hf.integer("num_attention_heads", c.heads);
  c.kv_heads = hf.integer("num_key_value_heads", c.heads);
  c.mlp_dim = hf.integer("intermediate_size", c.mlp_dim);
  c.max_positions = hf.integer("max_position_embeddings", c.max_positions);
  c.norm_eps = hf.number("rms_norm_eps", 1e-6);
  c.rope_theta = hf.number("rope_theta", hf.section("rope_parameters").number("rope_theta", 10000.0));
  c.rope_scaling = rope_scaling_from_hf(hf, c.max_positions);
  const std::string family = llama_hf_class_prefix(model_type);
  hf.require("hidden_act", {"silu"}, family);
  if (model_type == "llama" || model_type == "qwen3") {
    c.qkv_bias = c.out_bias = hf.flag("attention_bias", false);
  } else {  // a key their configs do not have: a file that sets it is of another model
    hf.require("attention_bias", {"false"}, family);
  }
  if (model_type == "llama") {
    c.mlp_bias = hf.flag("mlp_bias", false);
  } else {
    hf.require("mlp_bias", {"false"}, family);
  }
  if (model_type == "mistral") c.sliding_window = hf.integer("sliding_window", 0);  // null: none
  if (model_type == "qwen2") c.qkv_bias = true;
  if (model_type == "qwen3") c.qk_norm = true;
  if (model_type == "qwen2" || model_type == "qwen3") {
    // Their sliding window covers only the layers from max_window_layers on, when use_sliding_window says so.
    hf.require("use_sliding_window", {"false"}, family + " (full attention in every layer)");
    for (const std::string& layer : hf.texts("layer_types")) {
      if (layer != "full_attention") {
        hf.reject("layer_types", "shardtrain's " + family + " implements full_attention layers");
      }
    }
  }
  if (c.sliding_window < 0) hf.reject("sliding_window", "expected a positive number of positions, or null");
  c.tie_word_embeddings = hf.flag("tie_word_embeddings", false);  // LlamaConfig's default
  c.classifier = classifier_from_hf(hf, family + "ForSequenceClassification");
  if (c.heads <= 0 || c.kv_heads <= 0 || c.heads % c.kv_heads != 0) {
    hf.reject("num_attention_heads", "expected a positive multiple of num_key_value_heads (" +
                                         std::to_string(c.kv_heads) + ")");
  }
  c.head_dim = hf.integer("head_dim", model_type == "qwen3" ? 128 : 0);  // Qwen3Config's default
  if (c.head_dim == 0 && c.dim % c.heads != 0) {
    hf.reject("num_attention_heads", "expected a divisor of hidden_size (" + std::to_string(c.dim) +
                                         ") when head_dim is not given");
  }
  if (c.head_dim < 0 || c.head_size() % 2 != 0) {
    hf.reject("head_dim", "expected an even number (rotary embeddings rotate pairs), got " +
                              std::to_string(c.head_size()));
  }
  return c;
}

// model.overrides' names for the decoder (Mistral's also its window).
std::vector<std::pair<std::string, std::vector<std::string>>> decoder_override_keys(const std::string& model_type) {
  std::vector<std::pair<std::string, std::vector<std::string>>> keys = {
      {"layers", {"num_hidden_layers"}},   {"dim", {"hidden_size"}},
      {"heads", {"num_attention_heads"}},  {"kv_heads", {"num_key_value_heads"}},
      {"head_dim", {"head_dim"}},          {"mlp_dim", {"intermediate_size"}},
      {"vocab_size", {"vocab_size"}},      {"max_positions", {"max_position_embeddings"}},
      {"norm_eps", {"rms_norm_eps"}},      {"rope_theta", {"rope_theta"}}};
  if (model_type == "mistral") keys.push_back({"sliding_window", {"sliding_window"}});
  return keys;
}

// The four families of the one decoder differ in their flavors, config.json's model_type and layer class.
template <std::vector<std::string> (*Flavors)(), const char* kType>
ModelFamily decoder_family() {
  return {kType, Flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            const LlamaConfig c = llama_flavor(f);
            return std::make_shared<LlamaRecipe>(kType, f, c, llama_names, llama_layer_class(c));
          },
          kType,
          [](const HfConfig& hf, const std::string& name) -> std::shared_ptr<const ModelRecipe> {
            const LlamaConfig c = llama_from_hf(hf, kType);
            return std::make_shared<LlamaRecipe>(kType, name, c, llama_names, llama_layer_class(c));
          },
          decoder_override_keys(kType)};
}

constexpr char kLlama[] = "llama", kMistral[] = "mistral", kQwen2[] = "qwen2", kQwen3[] = "qwen3";

}  // namespace

ModelFamily llama_family() { return decoder_family<llama_flavors, kLlama>(); }
ModelFamily mistral_family() { return decoder_family<mistral_flavors, kMistral>(); }
ModelFamily qwen2_family() { return decoder_family<qwen2_flavors, kQwen2>(); }
ModelFamily qwen3_family() { return decoder_family<qwen3_flavors, kQwen3>(); }

}  // namespace shardtrain::models
