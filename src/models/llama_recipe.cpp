// Llama's recipe: causal language modelling (LlamaForCausalLM) on text, padding left out of the loss.
#include <ATen/ATen.h>

#include "models/families.h"
#include "models/recipe_helpers.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/llama.h"

namespace shardtrain::models {
namespace {

class LlamaCausalLm : public Task {
 public:
  explicit LlamaCausalLm(const LlamaConfig& config) : config_(config) {}
  std::string name() const override { return "causal_lm"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = config_.max_positions, d.vocab_size = config_.vocab_size;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"lm"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    const at::Tensor labels = b.input_ids.masked_fill(b.attention_mask == 0, kIgnoreIndex);
    Losses out;
    out.total = module_as<LlamaImpl>(model, "llama").run(b.input_ids, b.attention_mask, labels).loss;
    out.parts["lm"] = value_of(out.total);
    return out;
  }

 private:
  LlamaConfig config_;
};

class LlamaRecipe : public ModelRecipe {
 public:
  LlamaRecipe(std::string flavor, const LlamaConfig& config) : flavor_(std::move(flavor)), config_(config) {}
  std::string family() const override { return "llama"; }
  std::string flavor() const override { return flavor_; }
  std::shared_ptr<torch::nn::Module> build(const BuildOptions& options) const override {
    return Llama(config_, options).ptr();
  }
  NameMap hf_names() const override { return llama_names(); }
  std::string layer_class() const override { return "LlamaDecoderLayer"; }

  // Per sample, for T tokens of width d through L layers, with grouped-query attention (kv = d * kv_heads / heads:
  // q and o are d x d, k and v d x kv) and the gated MLP's three d x mlp_dim matrices:
  //   3 * L * (2 * (2 d^2 + 2 d kv + 3 d mlp_dim) * T + 4 T^2 d)   (embeddings and lm_head left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor_, b);
    const double d = static_cast<double>(config_.dim);
    const double kv = d * static_cast<double>(config_.kv_heads) / static_cast<double>(config_.heads);
    const double weights = 2 * d * d + 2 * d * kv + 3 * d * static_cast<double>(config_.mlp_dim);
    const double layers = static_cast<double>(config_.layers);
    return 3 * layers * transformer_layer_flops(weights, text_tokens(b), d) * batch_rows(b);
  }

  std::vector<std::string> tasks() const override { return {"causal_lm"}; }

 protected:
  std::unique_ptr<Task> make_task(const std::string&) const override {
    return std::make_unique<LlamaCausalLm>(config_);
  }

 private:
  std::string flavor_;
  LlamaConfig config_;
};

}  // namespace

ModelFamily llama_family() {
  return {"llama", llama_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<LlamaRecipe>(f, llama_flavor(f));
          }};
}

}  // namespace shardtrain::models
