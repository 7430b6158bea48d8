// What each family of the zoo trains on (private to the train layer): the sources it reads, how a data::Batch
// becomes its inputs and losses, and the FLOPs of a step.
//   flava  FLAVA pretraining: MIM (image), MLM (text), ITM + MMM + global contrastive (image-text)
//   bert   masked language modelling           (text)
//   vit    image classification on .cls labels  (image)
//   t5     span corruption (noise 0.15, mean span 3, sentinels from the top of the vocabulary)  (text)
//   llama  causal language modelling            (text)
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/data/loader.h"
#include "shardtrain/models/zoo.h"

namespace shardtrain::train {

struct Losses {
  at::Tensor total;                     // () what backward runs on
  std::map<std::string, double> parts;  // each loss's value ("mlm", "itm", ...), for the logs
};

// Every loss name compute_losses() reports, in a fixed order (the metrics' columns and the order of the ranks'
// reduction).
const std::vector<std::string>& loss_names();

// Model facts the data pipeline needs: sizes of images, text and vocabulary.
struct ModelShape {
  int64_t image_size = 0, patch_size = 0, codebook_size = 0;  // 0: no images / no codebook
  int64_t max_text_length = 0, vocab_size = 0;                // 0: no text
  int64_t num_labels = 0;                                     // classifier outputs (ViT)
  bool uses_mlm = false, uses_mim = false;
  std::array<bool, 3> kinds = {false, false, false};          // sources read: IMAGE_TEXT, TEXT, IMAGE
};
ModelShape model_shape(const std::string& family, const std::string& flavor);

// Forward pass and losses of one micro-batch. `seed` drives what the objective draws itself (T5's spans).
Losses compute_losses(models::ZooModel& model, const data::Batch& batch, uint64_t seed);

// Model FLOPs of a training step on this batch (forward + backward = 3 x forward): 2 FLOPs per multiply-add of
// every transformer layer's weights per token, plus attention's 4 * L^2 * d per layer; embeddings, heads and
// FLAVA's frozen codebook left out (the usual 6N convention).
double training_flops(const std::string& family, const std::string& flavor, const data::Batch& batch);

}  // namespace shardtrain::train
