// The sequence classifier a causal LM may carry in place of its LM head, as transformers' ...ForSequenceClassification
// of Llama, Mistral, Qwen2, Qwen3 and GPT-2: `score`, a linear map without bias from each row's last token's hidden
// state (the last position its attention mask keeps) to one output per class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::models {

struct SequenceClassifier {
  std::vector<std::string> labels;  // the classes by id (id2label); empty: none, the LM head. One: a regression
  bool multi_label = false;         // a set of classes per sample (problem_type multi_label_classification)
  int64_t pad_token_id = -1;        // config.json's pad_token_id, -1 none (transformers finds the last token by it)

  bool enabled() const { return !labels.empty(); }
  int64_t classes() const { return static_cast<int64_t>(labels.size()); }
  bool operator==(const SequenceClassifier& o) const {
    return labels == o.labels && multi_label == o.multi_label && pad_token_id == o.pad_token_id;
  }
};

}  // namespace shardtrain::models
