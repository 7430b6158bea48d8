// 64-bit hashing for seeds: SplitMix64's finaliser and FNV-1a over bytes (header only). Counter-based random
// streams (data/pipeline/random.h) and tensor parallelism's per-rank streams (tp/rng_fork.h) derive their seeds
// with these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardtrain::util {

// SplitMix64's finaliser: a bijective mix of 64 bits.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a over `size` bytes.
inline uint64_t fnv1a(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace shardtrain::util
