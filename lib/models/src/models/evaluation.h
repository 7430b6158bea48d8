// Held-out evaluation shared by the tasks (private to the models layer): a classifier's accuracy, F1 and loss (BERT's
// classify, ViT's image classification), a token classifier's entity F1 (BERT's token_classify), a language model's loss per token and perplexity (Llama's causal LM), each
// over whole batches of every rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/models/recipe.h"

namespace shardtrain::models {

// Evaluation's mode for a scope: no autograd, `model` in eval mode (dropout off); its training mode is restored on
// leaving the scope, an exception included.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Module& model);
  ~EvalMode();
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Module& model_;
  bool was_training_;
  c10::AutoGradMode grad_{false};
};

// The held-out samples evaluated: the largest multiple of world * batch_size up to in.max_samples (0: all). Throws
// std::invalid_argument when that is not one batch per rank.
int64_t whole_batches(const EvalInputs& in);

// The mean loss per predicted token of a causal language model over the held-out text (`token_losses` gives a
// batch's summed loss and its number of predicted tokens, the model in eval mode): eval_loss, perplexity (its
// exponential), eval_tokens and eval_samples. Collective over in.world.
std::map<std::string, double> evaluate_token_loss(
    torch::nn::Module& model, const EvalInputs& in,
    const std::function<std::pair<at::Tensor, int64_t>(const data::Batch&)>& token_losses);

// Runs `logits_of` ((B, classes) logits of a batch, the model in eval mode) over the largest multiple of world *
// batch_size held-out samples up to in.max_samples (0: all) of `kind`. Returns accuracy, f1 (binary: of class 1, as
// GLUE scores MRPC; more classes: the mean of the per-class F1s over the classes true or predicted, macro),
// eval_loss (mean cross-entropy) and eval_samples. One class is a regression (float scores): pearson, spearmanr
// (as run_glue scores STS-B), eval_loss (mean squared error) and eval_samples. `multi_label` (labels are sets of
// classes, an output > 0 predicts its class): f1 (micro, over every sample's every class, as transformers'
// run_classification scores a multi-label task), accuracy (every class of a sample right: scikit-learn's subset
// accuracy), eval_loss (mean binary cross-entropy per output) and eval_samples. Throws std::invalid_argument when
// there is not one batch per rank, std::runtime_error for a batch without labels or with one outside the classes.
// Collective over in.world.
std::map<std::string, double> evaluate_classifier(torch::nn::Module& model, const EvalInputs& in,
                                                  data::SampleKind kind, int64_t classes, bool multi_label,
                                                  const std::function<at::Tensor(const data::Batch&)>& logits_of);

// Token classification: runs `logits_of` ((B, T, classes) logits of a batch, the model in eval mode) over the
// held-out samples as evaluate_classifier does and scores the tokens whose label is not -100 (each word's first) as
// transformers' run_ner does with seqeval: precision, recall and f1 of the entities (overall, micro; the tags are
// `classes`' names, IOB), accuracy over those tokens; eval_loss (mean cross-entropy per scored token),
// eval_samples. Throws as evaluate_classifier. Collective over in.world.
std::map<std::string, double> evaluate_token_classifier(
    torch::nn::Module& model, const EvalInputs& in, const std::vector<std::string>& classes,
    const std::function<at::Tensor(const data::Batch&)>& logits_of);

// ", accuracy 0.50 -> 0.91, F1 0.40 -> 0.90, ..." (a regression's ", Pearson 0.10 -> 0.85, ...") for the run's
// closing line.
std::string describe_classifier_progress(const std::map<std::string, double>& first,
                                         const std::map<std::string, double>& last);

// Throws std::runtime_error unless `labels` ((B) int64, defined) are class ids below `classes` (one class, a
// regression: (B) float scores; `multi_label`: (B, classes) float 0/1); `who` names the model in the message.
void check_class_labels(const at::Tensor& labels, int64_t classes, bool multi_label, const std::string& who);
// Throws std::runtime_error unless `labels` are a token classifier's: (B, T) int64, each a class id below `classes`
// or -100.
void check_token_labels(const at::Tensor& labels, int64_t classes, const std::string& who);

}  // namespace shardtrain::models
