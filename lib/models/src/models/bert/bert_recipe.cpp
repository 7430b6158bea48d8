// BERT's recipe: masked-language modelling (BertForMaskedLM), sequence classification
// (BertForSequenceClassification: single texts or sentence pairs) and token classification
// (BertForTokenClassification: named entities) on text.
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "models/activation_model.h"
#include "models/evaluation.h"
#include "models/families.h"
#include "models/hf_config.h"
#include "models/recipe_helpers.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/models/bert.h"

namespace shardtrain::models {
namespace {

class BertMaskedLm : public Task {
 public:
  explicit BertMaskedLm(const BertConfig& config) : config_(config) {}
  std::string name() const override { return "masked_lm"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = config_.max_positions, d.vocab_size = config_.vocab_size, d.uses_mlm = true;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"mlm"}; }
  // The pooler (BertModel has one; every published BERT checkpoint holds it) takes no part in the MLM loss.
  bool leaves_parameters_unused() const override { return config_.pooler; }
  std::vector<std::string> modules_without_gradient() const override {
    return config_.pooler ? std::vector<std::string>{"pooler"} : std::vector<std::string>{};
  }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    Losses out;
    out.total = module_as<BertImpl>(model, "bert")
                    .run(b.input_ids_masked, b.attention_mask, {}, b.mlm_labels, /*labelled_only=*/true)
                    .loss;
    out.parts["mlm"] = value_of(out.total);
    return out;
  }

 private:
  BertConfig config_;
};

// Sequence classification (GLUE's MRPC: sentence pairs, two classes): cross-entropy of the classifier on the pooled
// [CLS] output; evaluated by accuracy and F1 on data.eval. One label is a regression (GLUE's STS-B: a similarity
// score per pair): the mean squared error of the one output, evaluated by Pearson's and Spearman's correlations.
// Multi-label (go_emotions: a set of classes per text): binary cross-entropy on every output, micro F1.
// Token classification (BertConfig::token_classifier; named entities: CoNLL-2003's tokens and ner_tags, as
// transformers' run_ner trains them): cross-entropy of the classifier on each word's first token, evaluated by
// seqeval's entity precision, recall and F1 and the accuracy over those tokens.
class BertClassify : public Task {
 public:
  BertClassify(std::string flavor, const BertConfig& config) : flavor_(std::move(flavor)), config_(config) {}
  std::string name() const override { return config_.token_classifier ? "token_classify" : "classify"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = config_.max_positions, d.vocab_size = config_.vocab_size;
    d.num_labels = classes(), d.class_names = config_.labels, d.multi_label = config_.multi_label;
    d.word_labels = config_.token_classifier;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"cls"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    if (config_.token_classifier) check_token_labels(b.labels, classes(), flavor_);
    else check_class_labels(b.labels, classes(), config_.multi_label, flavor_);
    Losses out;
    out.total = module_as<BertImpl>(model, "bert").run(b.input_ids, b.attention_mask, b.token_type_ids, b.labels).loss;
    out.parts["cls"] = value_of(out.total);
    return out;
  }
  bool has_evaluation() const override { return true; }
  data::SampleKind eval_kind() const override { return data::SampleKind::TEXT; }
  std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& in) const override {
    BertImpl& bert = module_as<BertImpl>(model, "bert");
    auto logits_of = [&](const data::Batch& b) {
      return bert.run(b.input_ids, b.attention_mask, b.token_type_ids).logits;
    };
    if (config_.token_classifier) return evaluate_token_classifier(model, in, config_.labels, logits_of);
    return evaluate_classifier(model, in, data::SampleKind::TEXT, classes(), config_.multi_label, logits_of);
  }
  std::string describe_progress(const std::map<std::string, double>& first,
                                const std::map<std::string, double>& last) const override {
    return describe_classifier_progress(first, last);
  }

 private:
  int64_t classes() const { return static_cast<int64_t>(config_.labels.size()); }
  std::string flavor_;
  BertConfig config_;
};

nlohmann::json bert_to_hf(const BertConfig& c);

class BertRecipe : public FamilyRecipe<BertConfig, Bert> {
 public:
  using FamilyRecipe::FamilyRecipe;
  std::string hf_config_json() const override { return bert_to_hf(config()).dump(2); }

  // Per sample, for T tokens of width d through L layers of 4 d^2 attention and 2 d * mlp_dim MLP weights:
  //   3 * L * (2 * (4 d^2 + 2 d mlp_dim) * T + 4 T^2 d)   (transformer_layer_flops; embeddings and head left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor(), b);
    const double d = static_cast<double>(config().dim);
    const double weights = 4 * d * d + 2 * d * static_cast<double>(config().mlp_dim);
    const double layers = static_cast<double>(config().layers);
    return 3 * layers * transformer_layer_flops(weights, text_tokens(b), d) * batch_rows(b);
  }

  // The masked-LM head's decoder is the word table.
  std::vector<std::string> tied_tables() const override {
    if (!config().mlm_head) return {};
    return {"embeddings.word.weight"};
  }

  // Megatron's split of every encoder layer (models/tensor_parallel.h: post-norm, the norms after each sum whole);
  // the embeddings, the pooler and the heads stay whole on every rank — the masked-LM decoder, the word table, too,
  // so its logits are whole (no sequence parallelism: nothing splits the tokens).
  TpPlan tp_plan() const override {
    const BertConfig& c = config();
    TpPlan plan = {{"embeddings.*", TpStyle::WHOLE}};
    for (TpRule& rule : transformer_layer_tp_plan("layers.*", bert_layer_options(c))) plan.push_back(std::move(rule));
    if (c.pooler) plan.push_back({"pooler", TpStyle::WHOLE});
    if (c.mlm_head) {
      plan.push_back({"mlm_transform", TpStyle::WHOLE});
      plan.push_back({"mlm_norm", TpStyle::WHOLE});
    }
    if (!c.labels.empty()) plan.push_back({"classifier", TpStyle::WHOLE});
    return plan;
  }

  // A classifier's config (BertForSequenceClassification, BertForTokenClassification) classifies by default.
  std::vector<std::string> tasks() const override {
    if (config().token_classifier) return {"token_classify", "classify", "masked_lm"};
    if (!config().labels.empty()) return {"classify", "token_classify", "masked_lm"};
    return {"masked_lm", "classify", "token_classify"};
  }
  // classify: the classifier over setup.labels (else the config's own classes) on the pooler, no MLM head;
  // token_classify: the classifier on every token, no pooler (BertForTokenClassification has none), no MLM head;
  // masked_lm: the MLM head, no classifier.
  std::shared_ptr<const ModelRecipe> with_task_head(const std::string& task, const TaskSetup& setup) const override {
    BertConfig c = config();
    if (task == "masked_lm") {
      if (c.mlm_head) return nullptr;
      c.mlm_head = true, c.labels.clear(), c.multi_label = false, c.token_classifier = false;
    } else {
      if (!setup.labels.empty()) c.labels = setup.labels;
      if (c.labels.empty()) {
        throw std::invalid_argument("model.task: " + task + " needs the classes: data.labels names none (e.g. " +
                                    (task == "classify" ? "data.labels: [not_equivalent, equivalent]"
                                                        : "data.labels: [O, B-PER, I-PER]") + ") and " + flavor() +
                                    " has no id2label");
      }
      if (task == "token_classify") {
        if (setup.multi_label) {
          throw std::invalid_argument("data.multi_label: a token classifier gives each word one class");
        }
        c.token_classifier = true, c.multi_label = false, c.mlm_head = false, c.pooler = false;
        if (c.labels == config().labels && config().token_classifier) return nullptr;
        return std::make_shared<BertRecipe>(family(), flavor(), c, bert_names, layer_class());
      }
      c.token_classifier = false;
      c.multi_label = setup.multi_label || config().multi_label;
      if (c.multi_label && c.labels.size() < 2) {
        throw std::invalid_argument("data.multi_label: sets of classes need 2 classes or more; " + flavor() +
                                    " would have " + std::to_string(c.labels.size()));
      }
      if (c.labels == config().labels && c.multi_label == config().multi_label && !c.mlm_head &&
          !config().token_classifier) {
        return nullptr;
      }
      c.mlm_head = false, c.pooler = true;
    }
    return std::make_shared<BertRecipe>(family(), flavor(), c, bert_names, layer_class());
  }

  // Embeddings: the sum LayerNorm keeps, its statistics and the dropout noise (word, position and type embeddings
  // are summed and freed). Layers: bert_layer_options. MLM head, over the K = N * mlm_probability labelled
  // positions only (labelled_only): their rows of the last layer's output (the transform's input), the transform's
  // output (gelu's), gelu's output (the norm's), the norm's statistics and output (the decoder's input), the loss.
  // Classifier: the last layer's output (its [CLS] row, the pooler's input, is a view of it), tanh's output, the
  // dropout noise and output (the classifier's input), the loss over one row per sample.
  ActivationBytes activation_bytes(const ActivationQuery& q) const override {
    const BertConfig& c = config();
    if (!c.mlm_head && c.labels.empty()) {
      throw std::invalid_argument(flavor() + " has no MLM head and no classifier: nothing to train, no activations");
    }
    const int64_t T = q.seq_len > 0 ? q.seq_len : c.max_positions, N = q.batch * T, unit = N * c.dim * stream_size(q);
    const int64_t norm = norm_kept(Norm::kLayerNorm, N, c.dim, q);
    if (c.token_classifier) {  // every token: the last layer's output, the dropout's noise and output, the loss
      const int64_t classes = static_cast<int64_t>(c.labels.size());
      const LossBytes loss = cross_entropy_bytes(N, classes, q);
      ActivationBytes a;
      add_transformer_layers(a, c.layers, bert_layer_options(c), q.batch, T, 0, q);
      a.outside_layers = unit + norm + dropout_kept(c.dropout, N * c.dim, q) + unit +
                         dropout_kept(c.classifier_dropout, N * c.dim, q) + unit + loss.kept;
      a.loss_transient = N * classes * (element_size(q) + 4);
      a.loss_kept = loss.kept;
      a.backward_transient = loss.backward_transient;
      return a;
    }
    if (!c.labels.empty()) {
      const int64_t classes = static_cast<int64_t>(c.labels.size()), row = q.batch * c.dim * element_size(q);
      const LossBytes loss = cross_entropy_bytes(q.batch, classes, q);
      ActivationBytes a;
      add_transformer_layers(a, c.layers, bert_layer_options(c), q.batch, T, 0, q);
      a.outside_layers = unit + norm + dropout_kept(c.dropout, N * c.dim, q) + unit + row +
                         dropout_kept(c.classifier_dropout, q.batch * c.dim, q) + row + loss.kept;
      a.loss_transient = q.batch * classes * (element_size(q) + 4);
      a.loss_kept = loss.kept;
      a.backward_transient = loss.backward_transient;
      return a;
    }
    const int64_t K = std::max<int64_t>(1, std::llround(static_cast<double>(N) * q.mlm_probability));
    const LossBytes loss = cross_entropy_bytes(K, c.vocab_size, q);
    ActivationBytes a;
    add_transformer_layers(a, c.layers, bert_layer_options(c), q.batch, T, 0, q);
    a.outside_layers = unit + norm + dropout_kept(c.dropout, N * c.dim, q) + 4 * K * c.dim * element_size(q) +
                       norm_kept(Norm::kLayerNorm, K, c.dim, q) + loss.kept;
    // The logits, and their float32 copy below float32, alive while log-softmax runs.
    a.loss_transient = K * c.vocab_size * (element_size(q) + (element_size(q) == 4 ? 0 : 4));
    a.loss_kept = loss.kept;
    a.backward_transient = loss.backward_transient;
    return a;
  }

  // BertModel: the pooler, no MLM head; its embeddings hold position and token type ids as int64 buffers.
  HfModelLayout hf_base_model() const override {
    BertConfig base = config();
    base.pooler = true, base.mlm_head = false;
    HfModelLayout out{"BertModel", hf_parameters(*Bert(base, meta_build()), hf_names(), "bert."),
                      {"^embeddings$", "^encoder\\.layer\\.\\d+$"}};
    for (const char* ids : {"embeddings.position_ids", "embeddings.token_type_ids"}) {
      out.tensors.push_back({ids, {1, base.max_positions}, at::kLong, true});
    }
    return out;
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string& name) const override {
    if (name == "classify" || name == "token_classify") {
      if (config().labels.empty() || config().token_classifier != (name == "token_classify")) {
        throw std::invalid_argument(flavor() + " has no " + (name == "classify" ? "sequence" : "token") +
                                    " classifier (recipe_for_task adds one)");
      }
      return std::make_unique<BertClassify>(flavor(), config());
    }
    if (!config().mlm_head) {
      throw std::invalid_argument(flavor() + " is a BertModel without a masked-LM head; train bert-debug or add one");
    }
    return std::make_unique<BertMaskedLm>(config());
  }
};

// transformers' BertConfig of `c`: BertForMaskedLM with the MLM head (the pooler is kept in the files: a
// BertForSequenceClassification fine-tune loads it), BertForSequenceClassification or BertForTokenClassification with
// the classifier (its classes as id2label / label2id), else BertModel.
nlohmann::json bert_to_hf(const BertConfig& c) {
  const char* architecture = c.mlm_head             ? "BertForMaskedLM"
                             : c.labels.empty()       ? "BertModel"
                             : c.token_classifier     ? "BertForTokenClassification"
                                                      : "BertForSequenceClassification";
  nlohmann::json j = {{"model_type", "bert"},
          {"architectures", {architecture}},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_positions},
          {"type_vocab_size", c.type_vocab_size},
          {"hidden_size", c.dim},
          {"num_hidden_layers", c.layers},
          {"num_attention_heads", c.heads},
          {"intermediate_size", c.mlp_dim},
          {"layer_norm_eps", c.norm_eps},
          {"hidden_dropout_prob", c.dropout},
          {"attention_probs_dropout_prob", c.dropout},
          {"hidden_act", "gelu"},
          {"position_embedding_type", "absolute"},
          {"pad_token_id", 0}};
  if (!c.labels.empty()) {
    j["classifier_dropout"] = c.classifier_dropout;
    hf_put_labels(j, c.labels, c.multi_label);
  }
  return j;
}

// Whether the weights beside a config.json (`path`: the file or its directory) hold BertModel's pooler: a
// BertForMaskedLM saved by transformers has none, one converted from the original BERT (bert-base-uncased on the
// Hub, whose config also says BertForMaskedLM) has one. True when there are no weights to look at (`path` is no
// file: a flavor with model.overrides).
bool weights_hold_pooler(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) return true;
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  if (!io::has_weight_files(dir.string())) return true;
  const io::WeightFiles files(dir.string());
  return files.find("bert.pooler.dense.weight") || files.find("pooler.dense.weight");
}

// BertConfig's keys. BertForMaskedLM / BertForPreTraining configs get the MLM head (what the task trains); every
// BERT gets the pooler, as BertModel has one, unless its weights have none.
BertConfig bert_from_hf(const HfConfig& hf, const std::string& path) {
  BertConfig c;
  c.vocab_size = hf.integer("vocab_size", c.vocab_size);
  c.max_positions = hf.integer("max_position_embeddings", c.max_positions);
  c.type_vocab_size = hf.integer("type_vocab_size", c.type_vocab_size);
  c.dim = hf.integer("hidden_size", c.dim);
  c.layers = hf.integer("num_hidden_layers", c.layers);
  c.heads = hf.integer("num_attention_heads", c.heads);
  c.mlp_dim = hf.integer("intermediate_size", c.mlp_dim);
  c.norm_eps = hf.number("layer_norm_eps", c.norm_eps);
  c.dropout = hf.number("hidden_dropout_prob", c.dropout);
  hf.require("hidden_act", {"gelu"}, "BERT");
  hf.require("position_embedding_type", {"absolute"}, "BERT");
  hf.require("is_decoder", {"false"}, "BERT (an encoder)");
  c.classifier_dropout = hf.number("classifier_dropout", c.dropout);
  bool classifier = false;
  for (const auto& a : hf.texts("architectures")) {
    if (a == "BertForMaskedLM" || a == "BertForPreTraining") c.mlm_head = true;
    classifier = classifier || a == "BertForSequenceClassification" || a == "BertForTokenClassification";
    c.token_classifier = c.token_classifier || a == "BertForTokenClassification";
  }
  if (c.mlm_head && classifier) hf.reject("architectures", "a BERT with both a masked-LM head and a classifier");
  if (classifier) {
    c.labels = hf.labels("id2label");
    if (c.labels.empty()) c.labels = {"LABEL_0", "LABEL_1"};  // transformers' default: two classes
    c.multi_label = hf.text("problem_type", "") == "multi_label_classification";
  }
  c.pooler = (classifier && !c.token_classifier) || (!classifier && weights_hold_pooler(path));
  return c;
}

}  // namespace

ModelFamily bert_family() {
  return {"bert", bert_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<BertRecipe>("bert", f, bert_flavor(f), bert_names, "BertLayer");
          },
          "bert",
          [](const HfConfig& hf, const std::string& name) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<BertRecipe>("bert", name, bert_from_hf(hf, name), bert_names, "BertLayer");
          },
          {{"layers", {"num_hidden_layers"}},
           {"dim", {"hidden_size"}},
           {"heads", {"num_attention_heads"}},
           {"mlp_dim", {"intermediate_size"}},
           {"vocab_size", {"vocab_size"}},
           {"max_positions", {"max_position_embeddings"}},
           {"type_vocab_size", {"type_vocab_size"}},
           {"norm_eps", {"layer_norm_eps"}},
           {"dropout", {"hidden_dropout_prob", "attention_probs_dropout_prob"}}}};
}

}  // namespace shardtrain::models
