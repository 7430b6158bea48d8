// What `accelerate estimate-memory` computes, with its arithmetic and its formatting, so that a model's table reads
// digit for digit as Accelerate's (tests/reference/estimate_memory_check.py compares the two):
//
//   auto sizes = plan::accelerate_sizes(recipe->hf_base_model());   // total bytes, largest layer
//   std::cout << plan::accelerate_table("bert-base-cased", sizes, {"float32", "float16"});
//
// Accelerate sizes transformers' AutoModel (the base model) in float32: parameters (tied ones once) and buffers in
// their own dtypes; a dtype row divides by 2 (float16, bfloat16), 4 (int8) or 8 (int4). "Training using Adam" is
// the largest of its stages for a batch of one and no activations: float32 model 1x, gradients 1x, Adam's two
// moments 2x, the step 4x; float16/bfloat16 (mixed precision) model 1x, gradients 1.5x, moments 2x, step 2x; int8
// and int4 "N/A". Sizes print in 1024-based units rounded to 2 decimals (Python's round and repr).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/models/hf_layout.h"

namespace shardtrain::plan {

struct ModelSizes {
  int64_t total_bytes = 0;                  // every tensor of the layout
  int64_t largest_layer_bytes = 0;          // the largest module kept whole (accelerate's get_max_layer_size)
  std::vector<std::string> largest_layers;  // the modules of that size
};

// Accelerate's calculate_maximum_sizes on a layout: a module is kept whole when it has no child module or its name
// matches one of layout.no_split; otherwise its child modules are looked at instead (the tensors it holds itself
// then count for no layer, as in Accelerate).
ModelSizes accelerate_sizes(const models::HfModelLayout& layout);

// The dtypes Accelerate's table has rows for (bfloat16 added: Accelerate's training estimate knows it, its
// command line does not).
const std::vector<std::string>& accelerate_dtypes();
// Throws std::invalid_argument naming `dtype` and listing accelerate_dtypes() when it is not one of them.
void check_accelerate_dtype(const std::string& dtype);

// Accelerate's estimate_training_usage for a model of `bytes` in float32 trained with Adam in `dtype`; nullopt
// for int8 / int4 (Accelerate's "N/A").
struct AdamStages {
  int64_t model = 0, gradients = 0, optimizer = 0, step = 0;
  int64_t highest() const;
};
std::optional<AdamStages> accelerate_training_usage(int64_t bytes, const std::string& dtype);

// Accelerate's convert_bytes: "413.18 MB". `integral`: the size is a Python int (an int below 1024 prints with no
// decimals: "512 bytes").
std::string accelerate_bytes(double bytes, bool integral = false);

// Accelerate's create_ascii_table (box-drawing characters, centered cells, the title over the whole width).
std::string ascii_table(const std::vector<std::string>& headers, const std::vector<std::vector<std::string>>& rows,
                        const std::string& title);

// `accelerate estimate-memory MODEL --dtypes ...`'s table: dtype, Largest Layer, Total Size, Training using Adam.
std::string accelerate_table(const std::string& model, const ModelSizes& sizes, const std::vector<std::string>& dtypes);

// The stages of "Training using Adam" as the seeds' table has them (dtype, Model, Gradients, Backward pass,
// Optimizer step, Highest), for the float dtypes of `dtypes`; empty when there is none. Backward pass is Adam's
// states (Accelerate's "optimizer"), Optimizer step its "step".
std::string adam_stages_table(const std::string& model, const ModelSizes& sizes,
                              const std::vector<std::string>& dtypes);

}  // namespace shardtrain::plan
