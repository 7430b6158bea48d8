#include "shardtrain/models/synthetic_batch.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace shardtrain::models {

data::Batch synthetic_batch(const DataNeeds& needs, int64_t batch, int64_t tokens, uint64_t seed) {
  at::manual_seed(seed);
  data::Batch b;
  b.kind = needs.largest_kind();
  if (b.kind != data::SampleKind::IMAGE) {
    b.input_ids = at::randint(5, std::max<int64_t>(needs.vocab_size, 6), {batch, tokens}, at::kLong);
    b.attention_mask = at::ones({batch, tokens}, at::kLong);
    // as the loader marks a [CLS] ... [SEP] row: the first and last tokens special, the text between
    b.sequence_ids = at::zeros({batch, tokens}, at::kLong);
    b.sequence_ids.select(1, 0).fill_(-1);
    b.sequence_ids.select(1, tokens - 1).fill_(-1);
    b.input_ids_masked = b.input_ids.clone();
    b.mlm_labels = at::where(at::rand({batch, tokens}) < 0.15, b.input_ids, at::full({}, -100, at::kLong));
    b.texts = batch;
  }
  if (b.kind != data::SampleKind::TEXT) {
    b.pixels = at::randn({batch, 3, needs.image_size, needs.image_size});
    const int64_t side = needs.image_size / std::max<int64_t>(needs.patch_size, 1);
    if (needs.uses_mim) b.masked_patches = at::rand({batch, side * side}) < 0.4;
    if (needs.codebook_size > 0) {
      b.codebook_pixels = at::rand({batch, 3, needs.codebook_size, needs.codebook_size}) * 0.8 + 0.1;
    }
    b.images = batch;
  }
  if (needs.num_labels > 0) {  // class ids; a regression's scores; a multi-label classifier's sets as rows of 0/1
    // a token classifier's class per token (every token scored: the most its loss holds)
    b.labels = needs.word_labels       ? at::randint(0, needs.num_labels, b.input_ids.sizes(), at::kLong)
               : needs.multi_label     ? (at::rand({batch, needs.num_labels}) < 0.5).to(at::kFloat)
               : needs.num_labels == 1 ? at::randn({batch})
                                       : at::randint(0, needs.num_labels, {batch}, at::kLong);
  }
  if (b.kind == data::SampleKind::IMAGE_TEXT) b.itm_labels = (at::arange(batch, at::kLong) % 2 == 0).to(at::kLong);
  return b;
}

}  // namespace shardtrain::models
