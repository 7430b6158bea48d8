// Memory sizes as people write them ("40GiB", "80GB", "512MiB", bytes), one type for the whole run: bytes in an
// int64_t, read from and written back to this text by the config (train.memory_budget, train.memory_limit), the
// planner's --gpu-memory and export's --max-shard-size.
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain::memory {

// Parses "40GiB", "80GB", "1.5TiB", "512MiB", or bytes ("4096B"; K, M, G, T alone are binary). Throws
// std::invalid_argument naming the text: a bare number too, whose unit nobody can know ("80": bytes or GB?).
int64_t parse_memory_size(const std::string& text);

// The shortest exact text for `bytes` that parse_memory_size reads back to them: "40GiB", "80GB", "1536MiB",
// "12345B"; "" for 0 (no size).
std::string memory_size_text(int64_t bytes);

// `bytes` for a person to read: "3.2 MiB" below a GiB, "61.87 GiB" from there.
std::string readable_size(int64_t bytes);

}  // namespace shardtrain::memory
