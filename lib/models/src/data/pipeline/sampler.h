// Which samples each rank reads: a deterministic stream over epochs, divided among ranks.
//
// The stream is the concatenation of epochs; epoch e is a permutation of [0, N) seeded by (seed, e). Global
// position g is sample perm_{g / N}(g % N). A step of W ranks x B samples takes positions [c, c + W*B): rank r the
// B positions c + r*B ... c + r*B + B - 1; the counter c then advances by W*B. So within an epoch every sample is
// read exactly once over all ranks (no duplicates, no gaps, any N, W, B: a batch may straddle two epochs), the
// order depends only on the seed and the epoch, and the data position is one number per source — what a
// checkpoint stores to resume exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace shardtrain::data {

// Epoch `epoch`'s order of [0, size).
std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch);

// sample_at() with the current epoch's permutation cached (one thread).
class EpochSampler {
 public:
  EpochSampler(int64_t size, uint64_t seed);
  int64_t size() const { return size_; }
  // The sample at global stream position `position` (>= 0).
  int64_t sample_at(int64_t position);
  // The B positions of `rank` in the step that starts at stream position `start`.
  static std::vector<int64_t> rank_positions(int64_t start, int64_t rank, int64_t batch);

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  int64_t size_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_;
};

}  // namespace shardtrain::data
