// What every causal LM (Llama and its kin, GPT-2) returns, as an LM or as a sequence classifier.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace shardtrain::models {

struct CausalLmOutputs {
  at::Tensor logits;  // (B, T, vocab); undefined when run labelled_only. A classifier's: (B, classes)
  at::Tensor loss;    // () next-token cross-entropy (labels shifted inside, -100 ignored), when labels are given;
                      // a classifier's classifier_loss (losses.h) against labels (B) or (B, classes)
  static auto fields() {  // forward_impl's tensors, in order (named_outputs.h)
    return std::make_tuple(&CausalLmOutputs::logits, &CausalLmOutputs::loss);
  }
};

}  // namespace shardtrain::models
