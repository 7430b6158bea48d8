// How a parameter of a tensor-parallel model is divided among the T ranks of its group, and the two conversions
// every user of the division needs: a rank's part of the whole tensor (splitting a model, loading a file or a
// checkpoint at another size) and the whole from every rank's part (merging a checkpoint). No communication.
//
// A parameter is split along one dimension, of extent E. Most splits are even (heads, an MLP's width: E divides by
// T, checked where the split is planned). A vocabulary need not divide (GPT-2's 50257 tokens): the parts are then
// as even as they can be, the first E % T ranks one row longer, as DTensor's Shard of an uneven size gives every
// rank a part. A fused projection holds `sections` equal sections side by side along the dimension (GPT-2's c_attn:
// q, k and v, 3 x C columns); each section is split alike and a rank's part is its slice of every section, in order.
// A dimension of fewer parts than ranks (grouped-query attention's key/value heads, 2 of them over 4 ranks) has
// `parts` parts, each held whole by ranks / parts consecutive ranks (Megatron's replicated key/value heads).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace shardtrain::tp {

struct SplitLayout {
  int64_t dim = 0;
  int64_t sections = 1;
  int64_t parts = 0;  // fewer parts than ranks, each on ranks / parts of them; 0: one part a rank
  bool operator==(const SplitLayout& other) const {
    return dim == other.dim && sections == other.sections && parts == other.parts;
  }
  // The part rank `rank` of `ranks` holds, and how many there are.
  int64_t part_index(int64_t rank, int64_t ranks) const { return parts > 0 ? rank * parts / ranks : rank; }
  int64_t part_count(int64_t ranks) const { return parts > 0 ? parts : ranks; }
};

// Rank `rank`'s part of an extent of `extent` over `ranks`: [start, start + size).
struct Part {
  int64_t start, size;
};
Part part_of(int64_t extent, int64_t ranks, int64_t rank);

// Rank `rank`'s part of `whole` (a view when sections == 1, else a new tensor). Throws std::invalid_argument when
// the dimension is not in whole, its extent does not hold `sections` equal sections of a row a part at least, or
// `parts` does not divide `ranks`.
at::Tensor slice_of(const at::Tensor& whole, const SplitLayout& layout, int64_t rank, int64_t ranks);

// The whole tensor from every rank's part, in rank order (the inverse of slice_of; of replicated parts, the first
// rank's). Throws std::invalid_argument when the parts do not agree beside the split dimension or a part's extent
// does not divide into the sections.
at::Tensor merge_parts(const std::vector<at::Tensor>& parts, const SplitLayout& layout);

}  // namespace shardtrain::tp
