// The masks of masked language modelling (BERT) and masked image modelling (BEiT / FLAVA), drawn from a given
// random engine so the caller decides what they depend on (the data pipeline: seed and sample position).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace shardtrain::data {

struct MlmMask {
  std::vector<int64_t> masked_ids;  // the input with chosen tokens replaced
  std::vector<int64_t> labels;      // the original token where chosen, -100 elsewhere
};

// Hugging Face's DataCollatorForLanguageModeling: each token not in `special` is chosen with `probability`; a
// chosen token becomes mask_id (80%), a random token in [0, vocab_size) (10%) or stays (10%).
MlmMask mlm_mask(const std::vector<int64_t>& ids, const std::vector<int64_t>& special, int64_t mask_id,
                 int64_t vocab_size, double probability, std::mt19937_64& rng);

// BEiT's block-wise masking (FlavaMaskingGenerator): rectangles of random area (at least `min_block` patches) and
// aspect ratio in [0.3, 1/0.3] until round(probability * height * width) patches are masked or no rectangle fits.
// Returns height * width flags, row-major.
std::vector<uint8_t> block_mask(int64_t height, int64_t width, double probability, int64_t min_block,
                                std::mt19937_64& rng);

}  // namespace shardtrain::data
