// Small pieces the family recipes share (private to the models layer).
#pragma once

#include <ATen/core/Tensor.h>

#include <stdexcept>
#include <string>
#include <typeinfo>

#include "shardtrain/data/loader.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::models {

// The family's module class behind a recipe's root (tasks receive the root as a torch::nn::Module).
template <class Impl>
Impl& module_as(torch::nn::Module& module, const std::string& family) {
  auto* impl = dynamic_cast<Impl*>(&module);
  if (!impl) throw std::invalid_argument("a " + family + " task was given a module that is not a " + family + " model");
  return *impl;
}

// A tensor's value as a double, for the logs.
inline double value_of(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

// Rows of a micro-batch, and its text length in tokens (0 without text).
inline double batch_rows(const data::Batch& b) {
  return static_cast<double>((b.input_ids.defined() ? b.input_ids : b.pixels).size(0));
}
inline double text_tokens(const data::Batch& b) {
  return b.input_ids.defined() ? static_cast<double>(b.input_ids.size(1)) : 0;
}

// The kind a family cannot read, for training_flops.
[[noreturn]] inline void throw_unread_kind(const std::string& flavor, const data::Batch& b) {
  throw std::invalid_argument(flavor + " reads no " + std::string(data::kind_name(b.kind)) + " batches");
}

}  // namespace shardtrain::models
