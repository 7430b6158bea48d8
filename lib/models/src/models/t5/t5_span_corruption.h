// T5's pretraining objective on one row of tokens (private to the models layer; the T5 recipe's task uses it,
// tests check it against hand-worked rows).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace shardtrain::models {

// Span corruption of one row of n token ids (no specials): masked = round(kSpanNoise * n) tokens (at least one when
// n > 1) are hidden in spans = round(masked / kMeanSpan) spans (at least one) of masked / spans tokens each (never
// more than are left to place), each at a random start; spans that meet merge. Each run of hidden tokens is
// replaced by one sentinel in the input; the target lists each sentinel followed by the tokens it hides, then EOS.
// Sentinels count down from `first_sentinel` (the top of the vocabulary, as T5's <extra_id_0> is). Span starts are
// drawn from `rng`.
// Returns (input ids, target ids).
constexpr double kSpanNoise = 0.15, kMeanSpan = 3.0;
std::pair<std::vector<int64_t>, std::vector<int64_t>> span_corrupt(const std::vector<int64_t>& tokens,
                                                                    int64_t first_sentinel, int64_t eos,
                                                                    std::mt19937_64& rng);

// The lengths span_corrupt's rows have for a batch row `width` tokens wide whose first and last are special (n =
// width - 2 text tokens): encoder n - masked + spans + 1, decoder masked + spans + 1 — one sentinel per span and the
// EOS; shorter where spans meet. What the FLOPs and activation estimates size T5's stacks by.
struct SpanLengths {
  int64_t encoder = 0, decoder = 0;
};
SpanLengths span_corruption_lengths(int64_t width);

}  // namespace shardtrain::models
