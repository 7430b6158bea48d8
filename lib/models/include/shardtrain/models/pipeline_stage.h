// A model cut into pipeline stages by whole transformer layers (pp/pipeline.h's Stage): the first stage holds the
// embeddings, the last the final norm, the head and the loss, each its run of layers. Llama's family (Llama,
// Mistral, Qwen2, Qwen3) with an untied head.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/pp/pipeline.h"

namespace shardtrain::models {

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

// The runs of `split` (every stage's layers) that pipeline rank `pp_rank` holds under `shape` (rank r: stages r,
// r + P, ...): what it builds (BuildOptions::stages), in stage order.
std::vector<StageLayers> stages_of_rank(const pp::ScheduleShape& shape, const std::vector<StageLayers>& split,
                                        int pp_rank);

// The microbatch's attention mask and labels (B, T), which every stage reads.
struct MicrobatchText {
  at::Tensor attention_mask, labels;
};

// A text batch's mask and its causal-LM labels (the tokens, padding -100), as the causal_lm task trains on them;
// and the positions whose next token is labelled, what its token-mean loss is over (evaluation weighs by them).
MicrobatchText causal_lm_text(const data::Batch& batch);
int64_t predicted_tokens(const MicrobatchText& text);

// One of the stages of a causal LM built as pipeline stages (BuildOptions::stages): `run` is which of the model's
// layer runs, its forward the model's (Llama::run_stage, through the model's own forward: a sharded model's root
// unit gathers and hooks as in any step). The first takes a microbatch's token ids, the last returns its loss,
// divided by `microbatches` (the step's gradients the mean over them). `text(m)`: microbatch m's mask and labels.
class LlamaStage : public pp::Stage {
 public:
  LlamaStage(Llama model, int64_t run, int microbatches, std::function<MicrobatchText(int)> text);
  at::Tensor forward(const at::Tensor& input, int microbatch) override;
  at::Tensor loss(const at::Tensor& output, int microbatch) override;
  // This stage's parameters by the model's names ("embed.weight", "layers.3.attn.q.weight", "lm_head.weight").
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;

 private:
  Llama model_;
  int64_t run_;
  int microbatches_;
  std::function<MicrobatchText(int)> text_;
};

}  // namespace shardtrain::models
