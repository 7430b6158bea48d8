// Memory sizes as people write them, for the planner's --gpu-memory and the trainer's train.memory_budget and
// train.memory_limit. Light on purpose: the config parser includes it.
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain::plan {

// Parses "40GiB", "80GB", "1.5TiB", "512MiB", or a byte count. Throws std::invalid_argument naming the text.
int64_t parse_memory_size(const std::string& text);

}  // namespace shardtrain::plan
