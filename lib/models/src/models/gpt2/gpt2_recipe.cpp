// GPT-2's recipe: causal language modelling (GPT2LMHeadModel) on text, padding left out of the loss; evaluated by the
// loss per token and perplexity on data.eval's text (run_clm's objective and metric). Or sequence classification
// (GPT2ForSequenceClassification) on each text's last token, as Llama's.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "models/activation_model.h"
#include "models/causal_lm.h"
#include "models/families.h"
#include "models/hf_config.h"
#include "models/recipe_helpers.h"
#include "shardtrain/models/gpt2.h"

namespace shardtrain::models {
namespace {

nlohmann::json gpt2_to_hf(const Gpt2Config& c);

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kGelu: return "gelu";
    case Activation::kRelu: return "relu";
    default: return "gelu_new";
  }
}

class Gpt2Recipe : public FamilyRecipe<Gpt2Config, Gpt2> {
 public:
  using FamilyRecipe::FamilyRecipe;
  std::string hf_config_json() const override { return gpt2_to_hf(config()).dump(2); }

  // Per sample, for T tokens of width d through L layers, with c_attn (d x 3d), c_proj (d x d) and the MLP's two
  // d x mlp_dim matrices:
  //   3 * L * (2 * (4 d^2 + 2 d mlp_dim) * T + 4 T^2 d)   (embeddings and the tied head left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor(), b);
    const Gpt2Config& c = config();
    const double d = static_cast<double>(c.dim);
    const double weights = 4 * d * d + 2 * d * static_cast<double>(c.mlp_dim);
    return 3 * static_cast<double>(c.layers) * transformer_layer_flops(weights, text_tokens(b), d) * batch_rows(b);
  }

  // As Llama's: a classifier's config classifies by default; classify puts score in place of the LM head.
  std::vector<std::string> tasks() const override { return causal_lm_tasks(config().classifier); }
  std::shared_ptr<const ModelRecipe> with_task_head(const std::string& task, const TaskSetup& setup) const override {
    const auto classifier = classifier_for_task(task, setup, config().classifier, flavor());
    if (!classifier) return nullptr;
    Gpt2Config c = config();
    c.classifier = *classifier;
    return std::make_shared<Gpt2Recipe>(family(), flavor(), c, gpt2_names, layer_class());
  }

  std::unique_ptr<TextDecoder> text_decoder(torch::nn::Module& model) const override {
    if (config().classifier.enabled()) refuse_to_generate(flavor(), "GPT2ForSequenceClassification");
    Gpt2Impl& gpt2 = module_as<Gpt2Impl>(model, family());
    return causal_lm_decoder(model, [&gpt2](const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& at) {
      return gpt2.run(ids, mask, {}, false, at).logits;
    });
  }
  // One table, read at both ends of the model: it stays in the root. A classifier's is a lookup's alone.
  std::vector<std::string> tied_tables() const override {
    if (config().classifier.enabled()) return {};
    return {"embed.weight"};
  }

  // Megatron's split (models/tensor_parallel.h): c_attn by thirds (q, k, v each split by heads), the token table
  // by vocabulary rows for its lookups and the tied head (50257 rows split as evenly as they can be), the position
  // table whole (under sequence parallelism each rank adds its positions' rows to its slice of the lookup).
  TpPlan tp_plan() const override {
    TpPlan plan = {{"embed", TpStyle::VOCAB_TABLE}, {"pos_embed", TpStyle::WHOLE}, {"norm", TpStyle::SEQUENCE_GATHER}};
    for (TpRule& rule : transformer_layer_tp_plan("layers.*", gpt2_layer_options(config()))) {
      plan.push_back(std::move(rule));
    }
    if (config().classifier.enabled()) plan.push_back({"score", TpStyle::WHOLE});
    return plan;
  }

  // Layers: gpt2_layer_options (the embeddings' sum, after its dropout, is layer 0's input). Under tensor
  // parallelism as Llama's: the stream outside the layers a rank's slice under sequence parallelism, the loss over
  // its rows of the vocabulary. Outside them the
  // embeddings' dropout, the final LayerNorm (its input and what it keeps) and the loss through
  // linear_cross_entropy at the positions that predict a label, as Llama's.
  // A classifier: the final LayerNorm over every token, then its output's last rows (the score's input) and the
  // loss over one row per sample, as Llama's.
  ActivationBytes activation_bytes(const ActivationQuery& q) const override {
    const Gpt2Config& c = config();
    const int64_t T = q.seq_len > 0 ? q.seq_len : c.max_positions, N = q.batch * T, sN = stream_rows(N, q);
    const int64_t unit = sN * c.dim * stream_size(q);
    ActivationBytes a;
    const TransformerLayerOptions layer = gpt2_layer_options(c);
    add_transformer_layers(a, c.layers, layer, q.batch, T, 0, q);
    a.bias_saved_by_attention = attention_fused(layer.attention, q);
    a.outside_layers = dropout_kept(c.embd_dropout, sN * c.dim, q) + unit +
                       norm_kept(Norm::kLayerNorm, sN, c.dim, q, stream_size(q));
    if (c.classifier.enabled()) {
      add_last_token_classifier(a, q.batch, c.dim, c.classifier.classes(), q);
      return a;
    }
    const LossBytes loss = linear_cross_entropy_bytes(N, tp_part(c.vocab_size, q), c.dim, q);
    a.outside_layers += loss.kept;
    a.loss_transient = loss.forward_transient + N * c.dim * stream_size(q);
    a.loss_kept = loss.kept;
    return a;
  }

  // GPT2Model: no LM head.
  HfModelLayout hf_base_model() const override {
    return {"GPT2Model", hf_parameters(*Gpt2(config(), meta_build()), hf_names(), "transformer."), {"^h\\.\\d+$"}};
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string& name) const override {
    const Gpt2Config& c = config();
    return causal_lm_task<Gpt2Impl>(name, "gpt2", flavor(), c.max_positions, c.vocab_size, c.classifier);
  }
};

// transformers' GPT2Config of `c` (for GPT2LMHeadModel, or GPT2ForSequenceClassification with its classes).
nlohmann::json gpt2_to_hf(const Gpt2Config& c) {
  const char* architecture = c.classifier.enabled() ? "GPT2ForSequenceClassification" : "GPT2LMHeadModel";
  nlohmann::json j = {{"model_type", "gpt2"},
                      {"architectures", {architecture}},
                      {"vocab_size", c.vocab_size},
                      {"n_positions", c.max_positions},
                      {"n_embd", c.dim},
                      {"n_layer", c.layers},
                      {"n_head", c.heads},
                      {"n_inner", c.mlp_dim},
                      {"activation_function", activation_name(c.activation)},
                      {"layer_norm_epsilon", c.norm_eps},
                      {"resid_pdrop", c.resid_dropout},
                      {"embd_pdrop", c.embd_dropout},
                      {"attn_pdrop", c.attn_dropout},
                      {"scale_attn_weights", true},
                      {"tie_word_embeddings", true}};
  hf_put_classifier(j, c.classifier);
  return j;
}

// The keys of GPT2Config (transformers' defaults where absent: n_inner null is 4 * n_embd).
Gpt2Config gpt2_from_hf(const HfConfig& hf) {
  Gpt2Config c;
  c.vocab_size = hf.integer("vocab_size", c.vocab_size);
  c.max_positions = hf.integer("n_positions", c.max_positions);
  c.dim = hf.integer("n_embd", c.dim);
  c.layers = hf.integer("n_layer", c.layers);
  c.heads = hf.integer("n_head", c.heads);
  c.mlp_dim = hf.integer("n_inner", 4 * c.dim);
  c.norm_eps = hf.number("layer_norm_epsilon", c.norm_eps);
  c.resid_dropout = hf.number("resid_pdrop", c.resid_dropout);
  c.embd_dropout = hf.number("embd_pdrop", c.embd_dropout);
  c.attn_dropout = hf.number("attn_pdrop", c.attn_dropout);
  // gelu_new and gelu_pytorch_tanh are the same tanh approximation.
  hf.require("activation_function", {"gelu_new", "gelu_pytorch_tanh", "gelu", "relu"}, "GPT-2");
  const std::string act = hf.text("activation_function", "gelu_new");
  c.activation = act == "gelu" ? Activation::kGelu : act == "relu" ? Activation::kRelu : Activation::kGeluTanh;
  hf.require("scale_attn_weights", {"true"}, "GPT-2 (attention scaled by 1 / sqrt(head size))");
  hf.require("scale_attn_by_inverse_layer_idx", {"false"}, "GPT-2 (no per-layer attention scaling)");
  hf.require("reorder_and_upcast_attn", {"false"}, "GPT-2");
  hf.require("add_cross_attention", {"false"}, "GPT-2 (a decoder alone)");
  hf.require("tie_word_embeddings", {"true"}, "GPT-2 (the LM head tied to wte)");
  if (c.heads <= 0 || c.dim % c.heads != 0) {
    hf.reject("n_head", "expected a positive divisor of n_embd (" + std::to_string(c.dim) + ")");
  }
  c.classifier = classifier_from_hf(hf, "GPT2ForSequenceClassification");
  return c;
}

}  // namespace

ModelFamily gpt2_family() {
  return {"gpt2", gpt2_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<Gpt2Recipe>("gpt2", f, gpt2_flavor(f), gpt2_names, "GPT2Block");
          },
          "gpt2",
          [](const HfConfig& hf, const std::string& name) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<Gpt2Recipe>("gpt2", name, gpt2_from_hf(hf), gpt2_names, "GPT2Block");
          },
          {{"layers", {"n_layer"}},
           {"dim", {"n_embd"}},
           {"heads", {"n_head"}},
           {"mlp_dim", {"n_inner"}},
           {"vocab_size", {"vocab_size"}},
           {"max_positions", {"n_positions"}},
           {"dropout", {"resid_pdrop", "embd_pdrop", "attn_pdrop"}}}};
}

}  // namespace shardtrain::models
