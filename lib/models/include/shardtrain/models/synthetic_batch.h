// A synthetic micro-batch shaped like what a task's loader makes, without data: for benchmarks, memory
// measurements and FLOP counts (bench/memory_model_bench.cpp, tests/unit/flop_count_test.cpp).
#pragma once

#include <cstdint>

#include "shardtrain/data/pipeline/loader.h"
#include "shardtrain/models/recipe.h"

namespace shardtrain::models {

// `batch` samples of the largest kind `needs` reads (image-text when it mixes kinds, as FLAVA's), with the masks and
// labels its objective uses at the data.* defaults (15% MLM, 40% MIM, half ITM negatives) and text rows of `tokens`
// tokens marked like the loader's [CLS] ... [SEP] (first and last special). Random, from `seed`.
data::Batch synthetic_batch(const DataNeeds& needs, int64_t batch, int64_t tokens, uint64_t seed);

}  // namespace shardtrain::models
