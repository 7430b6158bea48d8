#include "models/causal_lm.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "models/kv_cache.h"
#include "shardtrain/models/blocks.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/tp/regions.h"

namespace shardtrain::models {

namespace {

// mask (B, T): every row's ones come first.
bool is_right_padded(const at::Tensor& mask) {
  const int64_t t = mask.size(1);
  return t < 2 || (mask.narrow(1, 1, t - 1) <= mask.narrow(1, 0, t - 1)).all().item<bool>();
}

// The one bias every layer reads: none when causal attention in the fused kernel suffices (a window aside), else
// the padding hidden with the future.
at::Tensor layers_bias(const at::Tensor& attention_mask, bool causal_suffices, int64_t length, int64_t window,
                       at::ScalarType dtype, const at::Device& device) {
  if (attention_mask.defined() && !causal_suffices) {
    return hide_future(padding_bias(attention_mask, dtype), length, window);  // (B, 1, T, T)
  }
  if (window > 0) return causal_bias(length, dtype, device, window);  // (1, 1, T, T)
  return {};
}

}  // namespace

CausalLmStart causal_lm_start(const at::Tensor& attention_mask, const at::Tensor& labels, bool labelled_only,
                              int64_t length, int64_t window, at::ScalarType dtype, const at::Device& device) {
  CausalLmStart s;
  s.loss_only = labelled_only && labels.defined();
  if (s.loss_only) s.targets = next_token_labels(labels);
  const bool cpu_mask = attention_mask.defined() && attention_mask.device().is_cpu();
  const bool causal_suffices =
      cpu_mask && (s.loss_only ? is_right_padded(attention_mask) &&
                                     !((attention_mask == 0) & (s.targets != kIgnoreIndex)).any().item<bool>()
                               : (attention_mask != 0).all().item<bool>());
  s.bias = layers_bias(attention_mask, causal_suffices, length, window, dtype, device);
  return s;
}

CausalLmStart causal_classifier_start(const at::Tensor& attention_mask, int64_t length, int64_t window,
                                      at::ScalarType dtype, const at::Device& device) {
  CausalLmStart s;
  const bool causal_suffices =
      !attention_mask.defined() || (attention_mask.device().is_cpu() && is_right_padded(attention_mask));
  s.bias = layers_bias(attention_mask, causal_suffices, length, window, dtype, device);
  return s;
}

at::Tensor last_token_rows(const at::Tensor& hidden, const at::Tensor& attention_mask) {
  const int64_t rows = hidden.size(0), length = hidden.size(1);
  if (!attention_mask.defined()) return hidden.select(1, length - 1);
  // transformers' (positions * not_padding).argmax(-1): the last 1 of each row, 0 for a row of padding.
  const at::Tensor positions = at::arange(length, attention_mask.options().dtype(at::kLong));
  const at::Tensor last = (positions * (attention_mask != 0).to(at::kLong)).argmax(-1).to(hidden.device());
  return hidden.index({at::arange(rows, last.options()), last});  // (B, C)
}

TokenTable::TokenTable(EmbeddingImpl& table, bool tied_head)
    : table_(table), tied_(tied_head ? tie_table(table.weight) : TiedTable{}),
      shard_(table.vocab_shard ? &*table.vocab_shard : nullptr) {}

at::Tensor TokenTable::lookup(const at::Tensor& ids) const {
  // Tied: the lookups' rows go into the head's dense gradient, one vocab x dim gradient, not two.
  auto local = [&](const at::Tensor& i) {
    return tied_.head.defined() ? sparse_lookup(tied_.lookups[0], i) : at::embedding(table_.weight, i);
  };
  if (shard_ == nullptr) return local(ids);
  return vocab_parallel_lookup(ids, *shard_, table_.weight.size(0), table_.sequence_parallel, local);
}

at::Tensor TokenTable::head(const at::Tensor& h, const at::Tensor& targets) const {
  if (!tied_.head.defined()) throw std::logic_error("TokenTable: a table without its head has no logits");
  if (shard_ == nullptr) {
    return targets.defined() ? linear_cross_entropy(h, tied_.head, {}, targets) : tied_projection(h, tied_.head);
  }
  // Sequence parallel, the final norm's gather sums the input's gradient over the ranks; else this copy does.
  const at::Tensor in = table_.sequence_parallel ? h : tp::copy_to_group(h, shard_->group);
  if (targets.defined()) return linear_cross_entropy(in, tied_.head, {}, targets, shard_);
  return gather_vocabulary(tied_projection(in, tied_.head), *shard_);
}

CausalLmOutputs causal_lm_outputs(at::Tensor hidden, const CausalLmStart& start, const at::Tensor& labels,
                                  const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& head) {
  if (start.loss_only) {  // no logits: the loss in chunks (linear_cross_entropy)
    const LabelledRows labelled = labelled_rows(hidden, start.targets);
    hidden = at::Tensor();  // nothing keeps the norm's output: (B, T, C) less alive while the loss runs
    return {at::Tensor(), head(labelled.hidden, labelled.labels)};  // logits, loss
  }
  at::Tensor logits = head(hidden, at::Tensor());
  return {logits, labels.defined() ? causal_lm_loss(logits, labels) : at::Tensor()};
}

at::Tensor causal_lm_decode_bias(const at::Tensor& input_ids, const at::Tensor& attention_mask, int64_t window,
                                 at::ScalarType dtype) {
  if (!attention_mask.defined() || attention_mask.dim() != 2 || attention_mask.size(1) < input_ids.size(1)) {
    throw std::invalid_argument("cached decoding of " + std::to_string(input_ids.size(1)) + " tokens: the attention "
                                "mask must cover the cached positions and these, (B, P + T), got " +
                                (attention_mask.defined() ? c10::str(attention_mask.sizes()) : std::string("none")));
  }
  return decode_bias(attention_mask, input_ids.size(1), window, dtype);
}

namespace {

class CausalLmDecoder : public TextDecoder {
 public:
  CausalLmDecoder(torch::nn::Module& model, CausalLmForward forward) : caches_(model), forward_(std::move(forward)) {}

  at::Tensor start(const at::Tensor& ids, const at::Tensor& mask) override {
    mask_ = mask.to(at::kLong);
    const at::Tensor positions = (mask_.cumsum(1) - 1).masked_fill(mask_ == 0, 0);  // (B, T)
    last_ = positions.narrow(1, positions.size(1) - 1, 1);
    return forward_(ids, mask_, positions).select(1, -1).to(at::kFloat);
  }

  at::Tensor next(const at::Tensor& tokens) override {
    mask_ = at::cat({mask_, at::ones({mask_.size(0), 1}, mask_.options())}, 1);
    last_ = last_ + 1;
    return forward_(tokens.view({-1, 1}), mask_, last_).select(1, -1).to(at::kFloat);
  }

  void reorder(const at::Tensor& rows) override {
    caches_.reorder(rows);
    const at::Tensor on = rows.to(mask_.device());
    mask_ = mask_.index_select(0, on), last_ = last_.index_select(0, on);
  }

 private:
  KvCaches caches_;
  CausalLmForward forward_;
  at::Tensor mask_;  // (B, P): every position so far
  at::Tensor last_;  // (B, 1): the last one's position id
};

}  // namespace

std::unique_ptr<TextDecoder> causal_lm_decoder(torch::nn::Module& model, CausalLmForward forward) {
  return std::make_unique<CausalLmDecoder>(model, std::move(forward));
}

at::Tensor causal_lm_labels(const data::Batch& b) {
  return b.input_ids.masked_fill(b.attention_mask == 0, kIgnoreIndex);
}

int64_t causal_lm_predicted_tokens(const at::Tensor& labels) {
  return (labels.narrow(1, 1, labels.size(1) - 1) != kIgnoreIndex).sum().item<int64_t>();
}

std::vector<std::string> causal_lm_tasks(const SequenceClassifier& classifier) {
  if (classifier.enabled()) return {"classify", "causal_lm"};
  return {"causal_lm", "classify"};
}

std::optional<SequenceClassifier> classifier_for_task(const std::string& task, const TaskSetup& setup,
                                                      const SequenceClassifier& own, const std::string& flavor) {
  if (task == "causal_lm") {
    if (!own.enabled()) return std::nullopt;
    return SequenceClassifier{{}, false, own.pad_token_id};
  }
  SequenceClassifier c = own;
  if (!setup.labels.empty()) c.labels = setup.labels;
  if (c.labels.empty()) {
    throw std::invalid_argument("model.task: classify needs the classes: data.labels names none (e.g. data.labels: "
                                "[negative, positive]) and " + flavor + " has no id2label");
  }
  c.multi_label = setup.multi_label || own.multi_label;
  if (c.multi_label && c.labels.size() < 2) {
    throw std::invalid_argument("data.multi_label: sets of classes need 2 classes or more; " + flavor +
                                " would have " + std::to_string(c.labels.size()));
  }
  if (setup.pad_token_id) c.pad_token_id = *setup.pad_token_id;
  if (c == own) return std::nullopt;
  return c;
}

void hf_put_classifier(nlohmann::json& config, const SequenceClassifier& classifier) {
  if (classifier.pad_token_id >= 0) config["pad_token_id"] = classifier.pad_token_id;
  if (classifier.enabled()) hf_put_labels(config, classifier.labels, classifier.multi_label);
}

SequenceClassifier classifier_from_hf(const HfConfig& hf, const std::string& classifier_class) {
  SequenceClassifier c;
  c.pad_token_id = hf.integer("pad_token_id", -1);  // null: none
  for (const std::string& a : hf.texts("architectures")) {
    if (a != classifier_class) continue;
    c.labels = hf.labels("id2label");
    if (c.labels.empty()) c.labels = {"LABEL_0", "LABEL_1"};  // transformers' default: two classes
    c.multi_label = hf.text("problem_type", "") == "multi_label_classification";
  }
  return c;
}

void refuse_to_generate(const std::string& flavor, const std::string& classifier_class) {
  throw std::invalid_argument(flavor + " is a sequence classifier (" + classifier_class +
                              "): it does not generate text");
}

void check_causal_lm_task(const std::string& name, const SequenceClassifier& classifier, const std::string& flavor) {
  if ((name == "classify") == classifier.enabled()) return;
  throw std::invalid_argument(flavor + (classifier.enabled() ? " is a sequence classifier, without an LM head"
                                                             : " has no sequence classifier") +
                              " (recipe_for_task gives it the head of " + name + ")");
}

}  // namespace shardtrain::models
