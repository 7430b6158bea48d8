// Counter-based randomness for the data pipeline (and the trainer's per-rank seeds): every random decision is a
// function of (seed, sample position, purpose), never of thread timing or of what was drawn before, so batches are
// the same whichever worker builds them and after a resume.
#pragma once

#include <cstdint>
#include <random>

#include "shardtrain/util/mix64.h"

namespace shardtrain::data {

using util::mix64;

inline uint64_t hash_of(uint64_t a, uint64_t b, uint64_t c = 0) { return mix64(mix64(mix64(a) ^ b) ^ c); }

// What a draw is for; each purpose gets its own stream.
enum class Purpose : uint64_t { kPermutation = 1, kMlm, kMim, kItm, kItmPartner, kBatchKind, kSpan };

inline std::mt19937_64 rng_for(uint64_t seed, uint64_t position, Purpose purpose) {
  return std::mt19937_64(hash_of(seed, position, static_cast<uint64_t>(purpose)));
}

// Uniform in [0, 1) from one hash.
inline double unit_of(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace shardtrain::data
