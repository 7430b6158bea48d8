// A model's named outputs through its forward: forward_impl returns tensors alone (what the interceptors around
// it — fully_shard, activation checkpointing — pass on), and the outputs struct lists its fields once, in order, as
// member pointers, so that neither side unpacks by position:
//
//   struct BertOutputs {
//     at::Tensor hidden, pooled, logits, loss;
//     static auto fields() { return std::make_tuple(&BertOutputs::hidden, &BertOutputs::pooled, ...); }
//   };
//   std::vector<at::Tensor> BertImpl::forward_impl(...) { ...; return as_tensors(out); }
//   BertOutputs BertImpl::run(...) { return from_tensors<BertOutputs>(forward(...)); }
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace shardtrain::models {

template <class Outputs>
std::vector<at::Tensor> as_tensors(const Outputs& outputs) {
  return std::apply([&](auto... field) { return std::vector<at::Tensor>{outputs.*field...}; }, Outputs::fields());
}

// Throws std::logic_error when `tensors` is not one per field (a forward and its struct out of step).
template <class Outputs>
Outputs from_tensors(std::vector<at::Tensor> tensors) {
  constexpr size_t count = std::tuple_size_v<decltype(Outputs::fields())>;
  if (tensors.size() != count) {
    throw std::logic_error("a forward returned " + std::to_string(tensors.size()) + " tensors for an outputs "
                           "struct of " + std::to_string(count) + " fields");
  }
  Outputs outputs;
  size_t next = 0;
  std::apply([&](auto... field) { ((outputs.*field = std::move(tensors[next++])), ...); }, Outputs::fields());
  return outputs;
}

}  // namespace shardtrain::models
