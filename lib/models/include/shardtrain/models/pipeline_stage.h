// A model cut into pipeline stages by whole transformer layers (pp/pipeline.h's Stage): the first stage holds the
// embeddings, the last the final norm, the head and the loss, each its run of layers. Llama's family (Llama,
// Mistral, Qwen2, Qwen3) with an untied head.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "shardtrain/models/llama.h"
#include "shardtrain/pp/pipeline.h"

namespace shardtrain::models {

struct StageLayers {
  int64_t first = 0, count = 0;  // layers [first, first + count)
};

// `layers` over `stages`: at the given split points (each the first layer of a stage after the first, increasing),
// or as evenly as they divide (the first stages one more when they do not). Throws std::invalid_argument naming the
// numbers for more stages than layers, or split points out of order or range.
std::vector<StageLayers> split_layers(int64_t layers, int stages, const std::vector<int64_t>& split_points = {});

// `stages` runs of consecutive layers whose largest cost is the least it can be: `layer_costs` each layer's (FLOPs
// per token, say), `first_extra` and `last_extra` what the first and the last stage compute besides (the embedding;
// the norm, head and loss); among splits with the same largest cost, the most even (least sum of squared costs).
// Throws std::invalid_argument as split_layers for more stages than layers.
std::vector<StageLayers> balanced_split(const std::vector<double>& layer_costs, int stages, double first_extra = 0,
                                        double last_extra = 0);

// The microbatch's attention mask and labels (B, T), which every stage reads.
struct MicrobatchText {
  at::Tensor attention_mask, labels;
};

// Stage `stage` of `model`'s causal LM over `split`: the first takes a microbatch's token ids, the last returns its
// loss, divided by `microbatches` (the step's gradients the mean over them). `text(m)`: microbatch m's mask and
// labels. The model's other layers are left alone (the caller frees or never builds them).
class LlamaStage : public pp::Stage {
 public:
  LlamaStage(Llama model, int stage, std::vector<StageLayers> split, int microbatches,
             std::function<MicrobatchText(int)> text);
  at::Tensor forward(const at::Tensor& input, int microbatch) override;
  at::Tensor loss(const at::Tensor& output, int microbatch) override;
  std::vector<at::Tensor> parameters() override;
  // This stage's parameters by the model's names ("embed.weight", "layers.3.attn.q.weight", "lm_head.weight").
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;

 private:
  Llama model_;
  int stage_;
  std::vector<StageLayers> split_;
  int microbatches_;
  std::function<MicrobatchText(int)> text_;
};

}  // namespace shardtrain::models
