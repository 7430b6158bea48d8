// BERT's recipe: the masked-language-modelling task (BertForMaskedLM) on text.
#include <ATen/ATen.h>

#include "models/families.h"
#include "models/recipe_helpers.h"
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
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    Losses out;
    out.total = module_as<BertImpl>(model, "bert").run(b.input_ids_masked, b.attention_mask, {}, b.mlm_labels).loss;
    out.parts["mlm"] = value_of(out.total);
    return out;
  }

 private:
  BertConfig config_;
};

class BertRecipe : public FamilyRecipe<BertConfig, Bert> {
 public:
  using FamilyRecipe::FamilyRecipe;

  // Per sample, for T tokens of width d through L layers of 4 d^2 attention and 2 d * mlp_dim MLP weights:
  //   3 * L * (2 * (4 d^2 + 2 d mlp_dim) * T + 4 T^2 d)   (transformer_layer_flops; embeddings and head left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor(), b);
    const double d = static_cast<double>(config().dim);
    const double weights = 4 * d * d + 2 * d * static_cast<double>(config().mlp_dim);
    const double layers = static_cast<double>(config().layers);
    return 3 * layers * transformer_layer_flops(weights, text_tokens(b), d) * batch_rows(b);
  }

  std::vector<std::string> tasks() const override { return {"masked_lm"}; }

 protected:
  std::unique_ptr<Task> make_task(const std::string&) const override {
    if (!config().mlm_head) {
      throw std::invalid_argument(flavor() + " is a BertModel without a masked-LM head; train bert-debug or add one");
    }
    return std::make_unique<BertMaskedLm>(config());
  }
};

}  // namespace

ModelFamily bert_family() {
  return {"bert", bert_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<BertRecipe>("bert", f, bert_flavor(f), bert_names, "BertLayer");
          }};
}

}  // namespace shardtrain::models
