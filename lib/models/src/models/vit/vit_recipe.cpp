// ViT's recipe: image classification (ViTForImageClassification) on the .cls labels of image samples, evaluated by
// accuracy and F1 on data.eval's.
#include <ATen/ATen.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "models/activation_model.h"
#include "models/evaluation.h"
#include "models/families.h"
#include "models/hf_config.h"
#include "models/recipe_helpers.h"
#include "shardtrain/models/vit.h"

namespace shardtrain::models {
namespace {

class VitClassification : public Task {
 public:
  VitClassification(std::string flavor, const VitConfig& config) : flavor_(std::move(flavor)), config_(config) {}
  std::string name() const override { return "image_classification"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, false, true};
    d.image_size = config_.image_size, d.patch_size = config_.patch_size, d.num_labels = config_.num_labels;
    d.class_names = config_.labels, d.multi_label = config_.multi_label;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"cls"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    if (!b.labels.defined()) throw std::runtime_error("ViT classification needs a .cls label in every image sample");
    check_class_labels(b.labels, config_.num_labels, config_.multi_label, flavor_);
    Losses out;
    out.total = module_as<VitImpl>(model, "vit").run(b.pixels, b.labels, /*cls_only=*/true).loss;
    out.parts["cls"] = value_of(out.total);
    return out;
  }
  bool has_evaluation() const override { return true; }
  data::SampleKind eval_kind() const override { return data::SampleKind::IMAGE; }
  std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& in) const override {
    VitImpl& vit = module_as<VitImpl>(model, "vit");
    return evaluate_classifier(model, in, data::SampleKind::IMAGE, config_.num_labels, config_.multi_label,
                               [&](const data::Batch& b) { return vit.run(b.pixels, {}, /*cls_only=*/true).logits; });
  }
  std::string describe_progress(const std::map<std::string, double>& first,
                                const std::map<std::string, double>& last) const override {
    return describe_classifier_progress(first, last);
  }

 private:
  std::string flavor_;
  VitConfig config_;
};

nlohmann::json vit_to_hf(const VitConfig& c);

class VitRecipe : public FamilyRecipe<VitConfig, Vit> {
 public:
  using FamilyRecipe::FamilyRecipe;
  std::string hf_config_json() const override { return vit_to_hf(config()).dump(2); }

  // Per sample, over n = (image_size / patch_size)^2 + 1 tokens (patches and CLS) of width d through L layers:
  //   3 * L * (2 * (4 d^2 + 2 d mlp_dim) * n + 4 n^2 d)   (patch embedding and classifier left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::IMAGE) throw_unread_kind(flavor(), b);
    const double d = static_cast<double>(config().dim);
    const double side = static_cast<double>(config().image_size / config().patch_size), n = side * side + 1;
    const double weights = 4 * d * d + 2 * d * static_cast<double>(config().mlp_dim);
    // The last layer (cls_only) projects keys and values for the n tokens, the rest for the CLS token, which
    // attends to n keys.
    const double last = 2 * (2 * d * d) * n + 2 * (weights - 2 * d * d) + 4 * n * d;
    const double layers = static_cast<double>(config().layers);
    return 3 * ((layers - 1) * transformer_layer_flops(weights, n, d) + last) * batch_rows(b);
  }

  // Megatron's split of every encoder layer (models/tensor_parallel.h); the patch embedding, the final norm, the
  // pooler and the classifier stay whole (small beside the layers). No sequence parallelism: nothing splits the
  // tokens (the patches and CLS, 197 at 224 pixels), and the last layer computes the CLS row alone.
  TpPlan tp_plan() const override {
    TpPlan plan = {{"embeddings", TpStyle::WHOLE}, {"embeddings.patch", TpStyle::WHOLE}, {"norm", TpStyle::WHOLE}};
    for (TpRule& rule : transformer_layer_tp_plan("layers.*", vit_layer_options(config()))) {
      plan.push_back(std::move(rule));
    }
    if (config().pooler) plan.push_back({"pooler", TpStyle::WHOLE});
    if (config().num_labels > 0) plan.push_back({"classifier", TpStyle::WHOLE});
    return plan;
  }

  // classify: the same task under the name every classifier shares.
  std::vector<std::string> tasks() const override { return {"image_classification", "classify"}; }
  // A classifier over setup.labels (data.labels, or the dataset's ClassLabel) on the CLS token and no pooler: a
  // ViTModel's encoder fine-tuned as ViTForImageClassification, as transformers' run_image_classification builds
  // it. Without labels, the model's own classifier.
  std::shared_ptr<const ModelRecipe> with_task_head(const std::string&, const TaskSetup& setup) const override {
    if (setup.labels.empty() && !setup.multi_label) return nullptr;
    VitConfig c = config();
    if (!setup.labels.empty()) c.labels = setup.labels, c.num_labels = static_cast<int64_t>(setup.labels.size());
    c.pooler = false, c.multi_label = setup.multi_label || config().multi_label;
    if (c.multi_label && c.num_labels < 2) {
      throw std::invalid_argument("data.multi_label: sets of classes need 2 classes or more; " + flavor() +
                                  " would have " + std::to_string(c.num_labels));
    }
    if (c.labels == config().labels && c.num_labels == config().num_labels && c.multi_label == config().multi_label &&
        !config().pooler) {
      return nullptr;
    }
    return std::make_shared<VitRecipe>(family(), flavor(), c, vit_names, layer_class());
  }

  // Over n = (image_size / patch_size)^2 + 1 tokens: the batch's pixels (float32; under bf16/fp16 their cast copy is
  // what the patch convolution keeps), the embedding's dropout noise, the layers (vit_layer_options; the last one
  // computes the CLS token only), the final norm's input, statistics and output over the CLS rows, the loss.
  ActivationBytes activation_bytes(const ActivationQuery& q) const override {
    const VitConfig& c = config();
    if (c.num_labels <= 0) throw std::invalid_argument(flavor() + " has no classifier: nothing to train");
    const int64_t side = c.image_size / c.patch_size, n = side * side + 1, N = q.batch * n, e = element_size(q);
    const int64_t pixels = q.batch * c.channels * c.image_size * c.image_size;
    const LossBytes loss = cross_entropy_bytes(q.batch, c.num_labels, q);
    ActivationBytes a;
    add_transformer_layers(a, c.layers, vit_layer_options(c), q.batch, n, 0, q);
    a.layers.back().kept = transformer_layer_kept(vit_layer_options(c), q.batch, n, 0, q, /*queries=*/1);  // cls_only
    const int64_t cls = q.batch * c.dim;  // the final norm's input (the stream) and output (the classifier's input)
    a.outside_layers = pixels * 4 + (e == 4 ? 0 : pixels * e) + dropout_kept(c.dropout, N * c.dim, q) +
                       cls * stream_size(q) + norm_kept(Norm::kLayerNorm, q.batch, c.dim, q) +
                       stream_copies_kept(1, cls, q) + loss.kept;
    a.loss_kept = loss.kept;
    a.loss_transient = q.batch * c.num_labels * (e + 4);
    a.backward_transient = loss.backward_transient;
    return a;
  }

  // ViTModel: the pooler, no classifier.
  HfModelLayout hf_base_model() const override {
    VitConfig base = config();
    base.num_labels = 0, base.pooler = true;
    return {"ViTModel", hf_parameters(*Vit(base, meta_build()), hf_names(), "vit."),
            {"^embeddings$", "^encoder\\.layer\\.\\d+$"}};
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string&) const override {
    if (config().num_labels <= 0) {
      throw std::invalid_argument(flavor() + " has no classifier to train: give its classes (data.labels, or a "
                                  "dataset whose label column is a ClassLabel)");
    }
    return std::make_unique<VitClassification>(flavor(), config());
  }
};

// transformers' ViTConfig of `c`: ViTForImageClassification with its classes' names as id2label (else
// transformers' own default names, "LABEL_0"..) when it has a classifier, else ViTModel. DeepViT's re-attention
// has no transformers class: refused.
nlohmann::json vit_to_hf(const VitConfig& c) {
  if (c.re_attention) throw std::invalid_argument("a ViT with re-attention (DeepViT) has no transformers config");
  nlohmann::json j = {{"model_type", "vit"},
                      {"architectures", {c.num_labels > 0 ? "ViTForImageClassification" : "ViTModel"}},
                      {"image_size", c.image_size},
                      {"patch_size", c.patch_size},
                      {"num_channels", c.channels},
                      {"hidden_size", c.dim},
                      {"num_hidden_layers", c.layers},
                      {"num_attention_heads", c.heads},
                      {"intermediate_size", c.mlp_dim},
                      {"layer_norm_eps", c.norm_eps},
                      {"hidden_dropout_prob", c.dropout},
                      {"attention_probs_dropout_prob", c.dropout},
                      {"hidden_act", "gelu"},
                      {"qkv_bias", true}};
  if (c.num_labels > 0) {
    std::vector<std::string> names = c.labels;
    if (static_cast<int64_t>(names.size()) != c.num_labels) {
      names.clear();
      for (int64_t i = 0; i < c.num_labels; ++i) names.push_back("LABEL_" + std::to_string(i));
    }
    hf_put_labels(j, names, c.multi_label);
  }
  return j;
}

// ViTConfig's keys. A ViTForImageClassification config gets the classifier (one output per id2label entry) and no
// pooler, as transformers builds it; any other ViT is a ViTModel (pooler, no classifier).
VitConfig vit_from_hf(const HfConfig& hf) {
  VitConfig c;
  c.image_size = hf.integer("image_size", c.image_size);
  c.patch_size = hf.integer("patch_size", c.patch_size);
  c.channels = hf.integer("num_channels", c.channels);
  c.dim = hf.integer("hidden_size", c.dim);
  c.layers = hf.integer("num_hidden_layers", c.layers);
  c.heads = hf.integer("num_attention_heads", c.heads);
  c.mlp_dim = hf.integer("intermediate_size", c.mlp_dim);
  c.norm_eps = hf.number("layer_norm_eps", c.norm_eps);
  c.dropout = hf.number("hidden_dropout_prob", c.dropout);
  hf.require("hidden_act", {"gelu"}, "ViT");
  hf.require("qkv_bias", {"true"}, "ViT");
  const auto arch = hf.texts("architectures");
  const bool classifier = std::find(arch.begin(), arch.end(), "ViTForImageClassification") != arch.end();
  const int64_t entries = hf.entries("id2label");  // one: a regression (num_labels 1); none: transformers' two
  c.num_labels = classifier ? (entries > 0 ? entries : 2) : 0;
  if (classifier) c.labels = hf.labels("id2label");
  c.multi_label = classifier && hf.text("problem_type", "") == "multi_label_classification";
  c.pooler = !classifier;
  return c;
}

}  // namespace

ModelFamily vit_family() {
  return {"vit", vit_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<VitRecipe>("vit", f, vit_flavor(f), vit_names, "ViTLayer");
          },
          "vit",
          [](const HfConfig& hf, const std::string& name) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<VitRecipe>("vit", name, vit_from_hf(hf), vit_names, "ViTLayer");
          },
          {{"layers", {"num_hidden_layers"}},
           {"dim", {"hidden_size"}},
           {"heads", {"num_attention_heads"}},
           {"mlp_dim", {"intermediate_size"}},
           {"image_size", {"image_size"}},
           {"patch_size", {"patch_size"}},
           {"channels", {"num_channels"}},
           {"norm_eps", {"layer_norm_eps"}},
           {"dropout", {"hidden_dropout_prob", "attention_probs_dropout_prob"}}}};
}

}  // namespace shardtrain::models
