// Which of a model's linear layers train in float8 (issue 64; nn/float8_linear.h): torchao's rule — the
// transformer layers' projections whose GEMMs float8 tensor cores take (both sizes multiples of 16); the
// embeddings, the heads, LoRA's adapters and what the config excludes keep the activations' dtype.
//
//   models::Float8Layers float8(parallel::Float8Recipe::TENSORWISE, config.train.fp8_exclude, tp_size);
//   build.on_layer = [&](const std::string& name, const auto& layer) { float8.convert(name, *layer); };
//   ... build the model ...; logger.info(float8.describe());
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/nn/float8_linear.h"

namespace shardtrain::models {

class Float8Layers {
 public:
  // `exclude`: module names (or their prefixes: "layers.0" keeps the first layer's) that stay in high precision;
  // `tp`: the tensor-parallel size each projection is split by (its slices' sizes must divide by 16).
  Float8Layers(parallel::Float8Recipe recipe, std::vector<std::string> exclude, int64_t tp = 1);
  // Converts the Linear modules of a transformer layer named `name` ("layers.3"), before it is split or sharded.
  void convert(const std::string& name, torch::nn::Module& layer);
  // "float8 tensorwise: 21 projections of the transformer layers (layers.*.attn.q, ...); ...; 8 of them frozen
  // under LoRA adapters; 7 excluded (train.fp8_exclude: layers.0); 4 whose sizes do not divide by 16
  // (layers.0.attn.k: 24 x 64, ...)".
  std::string describe() const;
  int64_t converted() const { return static_cast<int64_t>(converted_.size()); }

 private:
  parallel::Float8Recipe recipe_;
  std::vector<std::string> exclude_;
  int64_t tp_;
  std::vector<std::string> converted_, excluded_, indivisible_;
  int64_t frozen_ = 0;  // converted bases of LoRA adapters (models/lora.h adds them before conversion)
};

}  // namespace shardtrain::models
