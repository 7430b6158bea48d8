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

class LlamaRecipe : public FamilyRecipe<LlamaConfig, Llama> {
 public:
  using FamilyRecipe::FamilyRecipe;

  // Per sample, for T tokens of width d through L layers, with grouped-query attention (kv = d * kv_heads / heads:
  // q and o are d x d, k and v d x kv) and the gated MLP's three d x mlp_dim matrices:
  //   3 * L * (2 * (2 d^2 + 2 d kv + 3 d mlp_dim) * T + 4 T^2 d)   (embeddings and lm_head left out)
  double training_flops(const data::Batch& b) const override {
    if (b.kind != data::SampleKind::TEXT) throw_unread_kind(flavor(), b);
    const double d = static_cast<double>(config().dim);
    const double kv = d * static_cast<double>(config().kv_heads) / static_cast<double>(config().heads);
    const double weights = 2 * d * d + 2 * d * kv + 3 * d * static_cast<double>(config().mlp_dim);
    const double layers = static_cast<double>(config().layers);
    return 3 * layers * transformer_layer_flops(weights, text_tokens(b), d) * batch_rows(b);
  }

  std::vector<std::string> tasks() const override { return {"causal_lm"}; }

 protected:
  std::unique_ptr<Task> make_task(const std::string&) const override {
    return std::make_unique<LlamaCausalLm>(config());
  }
};

}  // namespace

ModelFamily llama_family() {
  return {"llama", llama_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<LlamaRecipe>("llama", f, llama_flavor(f), llama_names, "LlamaDecoderLayer");
          }};
}

}  // namespace shardtrain::models
