#include "data/pipeline/masking.h"

#include <algorithm>
#include <cmath>

namespace shardtrain::data {
namespace {
double uniform(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0));
}
int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}
}  // namespace

MlmMask mlm_mask(const std::vector<int64_t>& ids, const std::vector<int64_t>& special, int64_t mask_id,
                 int64_t vocab_size, double probability, std::mt19937_64& rng) {
  MlmMask out{ids, std::vector<int64_t>(ids.size(), -100)};
  for (size_t i = 0; i < ids.size(); ++i) {
    if (std::find(special.begin(), special.end(), ids[i]) != special.end()) continue;
    if (uniform(rng, 0, 1) >= probability) continue;
    out.labels[i] = ids[i];
    const double action = uniform(rng, 0, 1);
    if (action < 0.8) {
      out.masked_ids[i] = mask_id;
    } else if (action < 0.9) {
      out.masked_ids[i] = uniform_int(rng, 0, vocab_size - 1);
    }
  }
  return out;
}

std::vector<uint8_t> block_mask(int64_t height, int64_t width, double probability, int64_t min_block,
                                std::mt19937_64& rng) {
  std::vector<uint8_t> mask(static_cast<size_t>(height * width), 0);
  const int64_t target = static_cast<int64_t>(std::llround(probability * static_cast<double>(height * width)));
  const double log_lo = std::log(0.3), log_hi = std::log(1 / 0.3);
  int64_t count = 0;
  while (count < target) {
    const int64_t budget = target - count;
    int64_t added = 0;
    for (int attempt = 0; attempt < 10 && added == 0; ++attempt) {
      const double area = uniform(rng, static_cast<double>(std::min(min_block, budget)), static_cast<double>(budget));
      const double aspect = std::exp(uniform(rng, log_lo, log_hi));
      const int64_t h = std::llround(std::sqrt(area * aspect)), w = std::llround(std::sqrt(area / aspect));
      if (h < 1 || w < 1 || h > height || w > width) continue;
      const int64_t top = uniform_int(rng, 0, height - h), left = uniform_int(rng, 0, width - w);
      int64_t already = 0;
      for (int64_t i = top; i < top + h; ++i) {
        for (int64_t j = left; j < left + w; ++j) already += mask[static_cast<size_t>(i * width + j)];
      }
      const int64_t fresh = h * w - already;
      if (fresh <= 0 || fresh > budget) continue;
      for (int64_t i = top; i < top + h; ++i) {
        for (int64_t j = left; j < left + w; ++j) {
          auto& m = mask[static_cast<size_t>(i * width + j)];
          if (!m) m = 1, ++added;
        }
      }
    }
    if (added == 0) break;
    count += added;
  }
  return mask;
}

}  // namespace shardtrain::data
