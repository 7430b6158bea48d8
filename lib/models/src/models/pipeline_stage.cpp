#include "shardtrain/models/pipeline_stage.h"

#include <stdexcept>
#include <string>

namespace shardtrain::models {

std::vector<StageLayers> split_layers(int64_t layers, int stages, const std::vector<int64_t>& split_points) {
  if (stages < 1 || stages > layers) {
    throw std::invalid_argument(std::to_string(stages) + " pipeline stages of " + std::to_string(layers) +
                                " layers: a stage holds at least one layer (at most " + std::to_string(layers) +
                                " stages)");
  }
  std::vector<int64_t> starts = {0};
  if (!split_points.empty()) {
    if (static_cast<int>(split_points.size()) != stages - 1) {
      throw std::invalid_argument(std::to_string(split_points.size()) + " split points for " +
                                  std::to_string(stages) + " stages (expected " + std::to_string(stages - 1) + ")");
    }
    for (int64_t p : split_points) {
      if (p <= starts.back() || p >= layers) {
        throw std::invalid_argument("split point " + std::to_string(p) + ": each starts a stage after the one " +
                                    "before's first layer (" + std::to_string(starts.back()) + ") and before the " +
                                    "last layer (" + std::to_string(layers) + " layers)");
      }
      starts.push_back(p);
    }
  } else {
    for (int s = 1; s < stages; ++s) {
      starts.push_back(starts.back() + layers / stages + (s - 1 < layers % stages ? 1 : 0));
    }
  }
  std::vector<StageLayers> out;
  for (size_t s = 0; s < starts.size(); ++s) {
    const int64_t end = s + 1 < starts.size() ? starts[s + 1] : layers;
    out.push_back({starts[s], end - starts[s]});
  }
  return out;
}

LlamaStage::LlamaStage(Llama model, int stage, std::vector<StageLayers> split, int microbatches,
                       std::function<MicrobatchText(int)> text)
    : model_(std::move(model)), stage_(stage), split_(std::move(split)), microbatches_(microbatches),
      text_(std::move(text)) {
  if (stage_ < 0 || stage_ >= static_cast<int>(split_.size())) {
    throw std::invalid_argument("stage " + std::to_string(stage_) + " of " + std::to_string(split_.size()));
  }
}

at::Tensor LlamaStage::forward(const at::Tensor& input, int microbatch) {
  const MicrobatchText t = text_(microbatch);
  const StageLayers& mine = split_[static_cast<size_t>(stage_)];
  return model_->run_stage(input, mine.first, mine.count, t.attention_mask, t.labels);
}

at::Tensor LlamaStage::loss(const at::Tensor& output, int) { return output / microbatches_; }

std::vector<std::pair<std::string, at::Tensor>> LlamaStage::named_parameters() const {
  const StageLayers& mine = split_[static_cast<size_t>(stage_)];
  const bool first = stage_ == 0, last = stage_ + 1 == static_cast<int>(split_.size());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model_->named_parameters()) {
    const std::string& name = p.key();
    bool held = (first && name.rfind("embed.", 0) == 0) ||
                (last && (name.rfind("norm.", 0) == 0 || name.rfind("lm_head.", 0) == 0));
    if (name.rfind("layers.", 0) == 0) {
      const int64_t layer = std::stoll(name.substr(7, name.find('.', 7) - 7));
      held = layer >= mine.first && layer < mine.first + mine.count;
    }
    if (held) out.emplace_back(name, p.value());
  }
  return out;
}

std::vector<at::Tensor> LlamaStage::parameters() {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : named_parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

}  // namespace shardtrain::models
