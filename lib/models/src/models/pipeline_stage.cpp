#include "shardtrain/models/pipeline_stage.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "models/causal_lm.h"

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

std::vector<StageLayers> balanced_split(const std::vector<double>& layer_costs, int stages, double first_extra,
                                        double last_extra) {
  const int64_t L = static_cast<int64_t>(layer_costs.size());
  if (stages < 1 || stages > L) split_layers(L, stages);  // its refusal
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0);
  for (int64_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + layer_costs[static_cast<size_t>(l)];
  // A run [from, to)'s cost: the first stage's carries first_extra, the one reaching the last layer last_extra.
  auto cost = [&](int64_t from, int64_t to) {
    return prefix[to] - prefix[from] + (from == 0 ? first_extra : 0) + (to == L ? last_extra : 0);
  };
  // best[s][l]: layers [0, l) in s runs, scored by (the largest run's cost, the sum of the runs' costs squared):
  // the least largest, and among those the most even.
  using Score = std::pair<double, double>;
  const Score none = {std::numeric_limits<double>::infinity(), 0};
  auto better = [](const Score& a, const Score& b) {
    if (!std::isfinite(b.first)) return std::isfinite(a.first);
    const double tolerance = 1e-9 * std::max(1.0, std::abs(b.first));
    return a.first < b.first - tolerance || (a.first <= b.first + tolerance && a.second < b.second - tolerance);
  };
  std::vector<std::vector<Score>> best(static_cast<size_t>(stages) + 1, std::vector<Score>(L + 1, none));
  std::vector<std::vector<int64_t>> start(static_cast<size_t>(stages) + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = {0, 0};
  for (int s = 1; s <= stages; ++s) {
    for (int64_t l = s; l <= L; ++l) {
      for (int64_t from = s - 1; from < l; ++from) {  // the last run [from, l)
        const double run = cost(from, l);
        const Score candidate = {std::max(best[s - 1][from].first, run), best[s - 1][from].second + run * run};
        if (better(candidate, best[s][l])) best[s][l] = candidate, start[s][l] = from;
      }
    }
  }
  std::vector<StageLayers> out(static_cast<size_t>(stages));
  for (int64_t s = stages, l = L; s >= 1; --s) {
    const int64_t from = start[s][l];
    out[static_cast<size_t>(s - 1)] = {from, l - from};
    l = from;
  }
  return out;
}

std::vector<StageLayers> stages_of_rank(const pp::ScheduleShape& shape, const std::vector<StageLayers>& split,
                                        int pp_rank) {
  std::vector<StageLayers> mine;
  for (int s = 0; s < shape.stages(); ++s) {
    if (shape.rank_of(s) == pp_rank) mine.push_back(split.at(static_cast<size_t>(s)));
  }
  return mine;
}

MicrobatchText causal_lm_text(const data::Batch& batch) {
  return {batch.attention_mask, causal_lm_labels(batch)};
}

int64_t predicted_tokens(const MicrobatchText& text) { return causal_lm_predicted_tokens(text.labels); }

LlamaStage::LlamaStage(Llama model, int64_t run, int microbatches, std::function<MicrobatchText(int)> text)
    : model_(std::move(model)), run_(run), microbatches_(microbatches), text_(std::move(text)) {
  if (run_ < 0 || run_ >= static_cast<int64_t>(model_->stages.size())) {
    throw std::invalid_argument("LlamaStage: run " + std::to_string(run_) + " of a model built with " +
                                std::to_string(model_->stages.size()) + " stages (BuildOptions::stages)");
  }
}

at::Tensor LlamaStage::forward(const at::Tensor& input, int microbatch) {
  const MicrobatchText t = text_(microbatch);
  model_->stage_to_run = run_;
  return model_->forward(input, t.attention_mask, t.labels, /*labelled_only=*/true, at::Tensor())[0];
}

at::Tensor LlamaStage::loss(const at::Tensor& output, int) { return output / microbatches_; }

std::vector<std::pair<std::string, at::Tensor>> LlamaStage::named_parameters() const {
  const StageLayers& mine = model_->stages[static_cast<size_t>(run_)];
  const bool first = mine.first == 0, last = mine.first + mine.count == model_->config.layers;
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

}  // namespace shardtrain::models
