// Held-out evaluation of a classifier (BERT's classify, ViT's image classification; private to the models layer):
// accuracy, F1 and the mean loss over the evaluated samples, gathered from every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>

#include "shardtrain/models/recipe.h"

namespace shardtrain::models {

// Runs `logits_of` ((B, classes) logits of a batch, the model in eval mode) over the largest multiple of world *
// batch_size held-out samples up to in.max_samples (0: all) of `kind`. Returns accuracy, f1 (binary: of class 1, as
// GLUE scores MRPC; more classes: the mean of the per-class F1s over the classes true or predicted, macro),
// eval_loss (mean cross-entropy) and eval_samples. Throws std::invalid_argument when there is not one batch per rank, std::runtime_error for a batch
// without labels or with one outside the classes. Collective over in.world.
std::map<std::string, double> evaluate_classifier(torch::nn::Module& model, const EvalInputs& in,
                                                  data::SampleKind kind, int64_t classes,
                                                  const std::function<at::Tensor(const data::Batch&)>& logits_of);

// ", accuracy 0.50 -> 0.91, F1 0.40 -> 0.90" for the run's closing line.
std::string describe_classifier_progress(const std::map<std::string, double>& first,
                                         const std::map<std::string, double>& last);

// Throws std::runtime_error unless `labels` ((B) int64, defined) are class ids below `classes`; `who` names the
// model in the message.
void check_class_labels(const at::Tensor& labels, int64_t classes, const std::string& who);

}  // namespace shardtrain::models
