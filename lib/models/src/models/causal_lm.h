// What the causal language models share (private to the models layer): Llama's decoder (and Mistral's, Qwen's) and
// GPT-2 differ in their layers, not in how a batch enters them or how the loss leaves them. The attention bias made
// once for every layer, the LM head at the positions that predict a label, and the causal_lm task with its
// evaluation (loss per token, perplexity).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/evaluation.h"
#include "shardtrain/models/causal_lm_outputs.h"
#include "models/hf_config.h"
#include "models/recipe_helpers.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/sequence_classifier.h"

namespace shardtrain::models {

// How a forward starts: the next-token targets when it computes the loss alone, and the one attention bias every
// layer reads.
struct CausalLmStart {
  bool loss_only = false;  // labelled_only with labels: no logits, the head fused with the loss
  at::Tensor targets;      // (B, T) next-token labels, -100 where none (loss_only)
  at::Tensor bias;         // (B, 1, T, T) padding and future hidden, (1, 1, T, T) a window, or undefined: causal in
                           // the fused kernel
};

// input_ids (B, T); attention_mask (B, T) or undefined; labels (B, T) or undefined; window: Mistral's sliding window
// where it cuts (0: none); dtype the attention's (attention_dtype of the embedding's output).
// Right padding (each row's tokens, then its padding): under causal attention no real position sees a padded one,
// so the padding mask changes only the padded positions' outputs. For the loss alone, when no padded position
// predicts a label, the mask is left out and attention runs causal in the fused kernel: no (B, 1, T, T) bias, the
// scores above the diagonal skipped. A mask without padding is left out on every path (the logits too): it hides
// nothing, and its (B, 1, T, T) bias would be an input every checkpointed layer keeps through backward. (CPU masks
// only: reading a device mask would wait for the device.)
CausalLmStart causal_lm_start(const at::Tensor& attention_mask, const at::Tensor& labels, bool labelled_only,
                              int64_t length, int64_t window, at::ScalarType dtype, const at::Device& device);

// A sequence classifier's start (Llama's score head, transformers' ...ForSequenceClassification): the bias, as
// causal_lm_start's. Right padding needs none (CPU masks: no real position sees a padded one, and the classifier
// reads a real one); left padding or a mask on the device hides the padding.
CausalLmStart causal_classifier_start(const at::Tensor& attention_mask, int64_t length, int64_t window,
                                      at::ScalarType dtype, const at::Device& device);

// What a sequence classifier scores: each row's last token's hidden state, (B, C) of hidden (B, T, C) — the last
// position whose attention_mask (B, T) is 1, the last position without a mask.
at::Tensor last_token_rows(const at::Tensor& hidden, const at::Tensor& attention_mask);

// The model's outputs from the final hidden states (B, T, C): logits (B, T, vocab) and the loss or undefined, or
// for the loss alone the loss without logits, with the head at the labelled rows only, fused with the cross-entropy in chunks.
// `head(hidden, targets)` is the LM head: logits of hidden (..., C) when targets is undefined, else the loss of
// rows (N, C) against targets (N) (linear_cross_entropy). `hidden` is released before the loss runs.
CausalLmOutputs causal_lm_outputs(at::Tensor hidden, const CausalLmStart& start, const at::Tensor& labels,
                                  const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& head);

// A causal LM's token table (GPT-2's wte, a tied Llama's embed_tokens) for one forward: read by the lookups and, when
// `tied_head`, by the LM head too (tie_table: one dense gradient); a classifier's by the lookups alone. Split by
// vocabulary rows when its VocabParallelTable carries a shard (tensor parallelism's TpStyle::VOCAB_TABLE): each rank
// looks up and projects onto its rows, the loss over the split logits.
class TokenTable {
 public:
  TokenTable(EmbeddingImpl& table, bool tied_head);
  // ids (B, T) -> (B, T, C); under sequence parallelism this rank's slice of the sequence, (B, T / t, C).
  at::Tensor lookup(const at::Tensor& ids) const;
  // The LM head (tied_head only), as causal_lm_outputs' `head`: logits (..., vocab) of h (..., C) when targets is
  // undefined, else the loss of rows (N, C) against targets (N).
  at::Tensor head(const at::Tensor& h, const at::Tensor& targets) const;
  // The shard of a split table (its group), or null.
  const VocabShard* shard() const { return shard_; }
  bool sequence_parallel() const { return shard_ != nullptr && table_.sequence_parallel; }

 private:
  EmbeddingImpl& table_;
  TiedTable tied_;  // empty unless tied_head
  const VocabShard* shard_;
};

// Cached decoding (generation.h): input_ids (B, T) the new tokens, attention_mask (B, P + T) over the P positions
// the attention modules' caches hold (kv_cache.h) and these. The one bias every layer reads, (B, 1, T, P + T)
// (blocks.h decode_bias). Throws std::invalid_argument when the mask is missing or shorter than the ids.
at::Tensor causal_lm_decode_bias(const at::Tensor& input_ids, const at::Tensor& attention_mask, int64_t window,
                                 at::ScalarType dtype);

// A causal LM's TextDecoder: KV caches attached to `model`'s attention modules while it lives; each step calls
// forward(input_ids (B, T), attention_mask (B, P + T), position_ids (B, T)), the model's forward with position_ids
// (cached decoding), which returns the last position's logits (B, 1, vocab). Positions as transformers' generate:
// each row's tokens counted from 0, left padding skipped.
using CausalLmForward = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
std::unique_ptr<TextDecoder> causal_lm_decoder(torch::nn::Module& model, CausalLmForward forward);

// The tokens of a text batch as labels, padding -100.
at::Tensor causal_lm_labels(const data::Batch& b);
// Positions whose next token is labelled: the labels (B, T) that are not -100 but a row's first.
int64_t causal_lm_predicted_tokens(const at::Tensor& labels);

// Causal language modelling (transformers' ...ForCausalLM) on text, padding left out of the loss; evaluated by the
// loss per token and perplexity on data.eval's text. `Impl` is the family's module, whose run(input_ids,
// attention_mask, labels, labelled_only) returns outputs with a `loss`.
template <class Impl>
class CausalLmTask : public Task {
 public:
  CausalLmTask(std::string family, int64_t max_positions, int64_t vocab_size)
      : family_(std::move(family)), max_positions_(max_positions), vocab_size_(vocab_size) {}
  std::string name() const override { return "causal_lm"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = max_positions_, d.vocab_size = vocab_size_;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"lm"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    Losses out;
    out.total = module_as<Impl>(model, family_).run(b.input_ids, b.attention_mask, causal_lm_labels(b), true).loss;
    out.parts["lm"] = value_of(out.total);
    return out;
  }
  bool has_evaluation() const override { return true; }
  data::SampleKind eval_kind() const override { return data::SampleKind::TEXT; }
  // Each batch's mean loss times its predicted tokens (every token but a row's first, padding aside): the sum.
  std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& in) const override {
    if (in.pipeline_token_loss) return evaluate_token_loss(model, in, in.pipeline_token_loss);
    Impl& lm = module_as<Impl>(model, family_);
    return evaluate_token_loss(model, in, [&](const data::Batch& b) {
      const at::Tensor labels = causal_lm_labels(b);
      const int64_t tokens = causal_lm_predicted_tokens(labels);
      const at::Tensor loss = lm.run(b.input_ids, b.attention_mask, labels, /*labelled_only=*/true).loss;
      return std::make_pair(loss * static_cast<double>(tokens), tokens);
    });
  }
  std::string describe_progress(const std::map<std::string, double>& first,
                                const std::map<std::string, double>& last) const override {
    char text[120];
    std::snprintf(text, sizeof(text), ", eval loss %.4f -> %.4f, perplexity %.2f -> %.2f", first.at("eval_loss"),
                  last.at("eval_loss"), first.at("perplexity"), last.at("perplexity"));
    return text;
  }

 private:
  std::string family_;
  int64_t max_positions_, vocab_size_;
};

// Sequence classification by a causal LM's decoder (transformers' LlamaForSequenceClassification, as
// run_classification fine-tunes it): the classifier's loss on each row's last token (classifier_loss: cross-entropy,
// a regression's squared error, a multi-label binary cross-entropy); evaluated as BERT's classify, by accuracy and F1
// (a regression's correlations) on data.eval. `Impl`'s run(input_ids, attention_mask, labels) returns outputs with
// the classifier's `logits` (B, classes) and `loss`.
template <class Impl>
class CausalLmClassify : public Task {
 public:
  CausalLmClassify(std::string family, std::string flavor, int64_t max_positions, int64_t vocab_size,
                   std::vector<std::string> labels, bool multi_label)
      : family_(std::move(family)),
        flavor_(std::move(flavor)),
        max_positions_(max_positions),
        vocab_size_(vocab_size),
        labels_(std::move(labels)),
        multi_label_(multi_label) {}
  std::string name() const override { return "classify"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {false, true, false};
    d.max_text_length = max_positions_, d.vocab_size = vocab_size_;
    d.num_labels = classes(), d.class_names = labels_, d.multi_label = multi_label_;
    return d;
  }
  std::vector<std::string> loss_names() const override { return {"cls"}; }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    check_class_labels(b.labels, classes(), multi_label_, flavor_);
    Losses out;
    out.total = module_as<Impl>(model, family_).run(b.input_ids, b.attention_mask, b.labels).loss;
    out.parts["cls"] = value_of(out.total);
    return out;
  }
  bool has_evaluation() const override { return true; }
  data::SampleKind eval_kind() const override { return data::SampleKind::TEXT; }
  std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& in) const override {
    Impl& lm = module_as<Impl>(model, family_);
    return evaluate_classifier(model, in, data::SampleKind::TEXT, classes(), multi_label_,
                               [&](const data::Batch& b) { return lm.run(b.input_ids, b.attention_mask).logits; });
  }
  std::string describe_progress(const std::map<std::string, double>& first,
                                const std::map<std::string, double>& last) const override {
    return describe_classifier_progress(first, last);
  }

 private:
  int64_t classes() const { return static_cast<int64_t>(labels_.size()); }
  std::string family_, flavor_;
  int64_t max_positions_, vocab_size_;
  std::vector<std::string> labels_;
  bool multi_label_;
};

// The tasks of a causal LM with `classifier`, its default first: classify for a classifier, else causal_lm.
std::vector<std::string> causal_lm_tasks(const SequenceClassifier& classifier);

// The classifier a causal LM whose own is `own` takes for `task` (recipe_for_task): for classify setup.labels (else
// its own classes), setup's multi_label (or its own) and padding id; for causal_lm none. nullopt when the model
// trains the task as it is. Throws std::invalid_argument, as BERT's classify does, when there are no classes or a
// set of one class.
std::optional<SequenceClassifier> classifier_for_task(const std::string& task, const TaskSetup& setup,
                                                      const SequenceClassifier& own, const std::string& flavor);

// config.json's keys of a classifier: pad_token_id when set; id2label, label2id and problem_type when enabled.
void hf_put_classifier(nlohmann::json& config, const SequenceClassifier& classifier);
// What config.json says of the classifier: with `classifier_class` ("LlamaForSequenceClassification") among its
// architectures, its id2label (transformers' two classes when it has none) and problem_type; pad_token_id either way.
SequenceClassifier classifier_from_hf(const HfConfig& hf, const std::string& classifier_class);

// Throws std::invalid_argument: `flavor` is a sequence classifier (`classifier_class`) and generates no text.
[[noreturn]] void refuse_to_generate(const std::string& flavor, const std::string& classifier_class);
// Throws std::invalid_argument unless task `name` is the one a model of `classifier` trains as it is.
void check_causal_lm_task(const std::string& name, const SequenceClassifier& classifier, const std::string& flavor);

// The task `name` of a causal LM of `family` whose module is `Impl`: classify or causal_lm (check_causal_lm_task).
template <class Impl>
std::unique_ptr<Task> causal_lm_task(const std::string& name, const std::string& family, const std::string& flavor,
                                     int64_t max_positions, int64_t vocab_size, const SequenceClassifier& classifier) {
  check_causal_lm_task(name, classifier, flavor);
  if (classifier.enabled()) {
    return std::make_unique<CausalLmClassify<Impl>>(family, flavor, max_positions, vocab_size, classifier.labels,
                                                    classifier.multi_label);
  }
  return std::make_unique<CausalLmTask<Impl>>(family, max_positions, vocab_size);
}

}  // namespace shardtrain::models
