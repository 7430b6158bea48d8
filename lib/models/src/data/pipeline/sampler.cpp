#include "data/pipeline/sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "shardtrain/data/pipeline/random.h"

namespace shardtrain::data {

EpochSampler::EpochSampler(int64_t size, uint64_t seed) : size_(size), seed_(seed) {
  if (size <= 0) throw std::invalid_argument("EpochSampler: a source of " + std::to_string(size) + " samples");
}

std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  auto rng = rng_for(seed, static_cast<uint64_t>(epoch), Purpose::kPermutation);
  // Fisher-Yates with our own draws: std::shuffle's algorithm is implementation-defined.
  for (int64_t i = size - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

const std::vector<int64_t>& EpochSampler::permutation(int64_t epoch) {
  if (epoch != cached_epoch_) {
    cached_ = epoch_permutation(size_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return cached_;
}

int64_t EpochSampler::sample_at(int64_t position) {
  if (position < 0) throw std::invalid_argument("EpochSampler: negative position " + std::to_string(position));
  return permutation(position / size_)[static_cast<size_t>(position % size_)];
}

std::vector<int64_t> EpochSampler::rank_positions(int64_t start, int64_t rank, int64_t batch) {
  std::vector<int64_t> out(static_cast<size_t>(batch));
  std::iota(out.begin(), out.end(), start + rank * batch);
  return out;
}

}  // namespace shardtrain::data
