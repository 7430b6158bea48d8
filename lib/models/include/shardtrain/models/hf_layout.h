// A Hugging Face model as its tensors: what `shardtrain estimate-memory` sizes the way Accelerate's
// `accelerate estimate-memory` does, without building the model in Python.
//
// Accelerate builds transformers' AutoModel of a config (the base model: BertModel, not BertForMaskedLM) on the
// meta device and sums every parameter (tied tensors once) and buffer; its "largest layer" walks the module tree,
// keeping whole the modules of the model's _no_split_modules classes. The tree is recovered here from the dotted
// names: a name's every prefix is a module.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::models {

struct HfTensor {
  std::string name;            // Hugging Face's ("encoder.layer.0.attention.self.query.weight")
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  bool buffer = false;         // a registered buffer (position ids, rotary frequencies), not a parameter
};

struct HfModelLayout {
  std::string class_name;              // transformers' class ("BertModel")
  std::vector<HfTensor> tensors;       // parameters (tied ones once, under their first name), then buffers
  std::vector<std::string> no_split;   // regexes of the module names transformers keeps whole (_no_split_modules)
};

}  // namespace shardtrain::models
