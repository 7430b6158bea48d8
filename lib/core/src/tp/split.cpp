#include "shardtrain/tp/split.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardtrain::tp {

namespace {

std::string layout_text(const SplitLayout& layout) {
  return "dimension " + std::to_string(layout.dim) +
         (layout.sections > 1 ? " in " + std::to_string(layout.sections) + " sections" : "");
}

// The extent of one section along the layout's dimension.
int64_t section_extent(const at::Tensor& t, const SplitLayout& layout, const char* what) {
  if (layout.dim < 0 || layout.dim >= t.dim() || layout.sections < 1 || t.size(layout.dim) % layout.sections != 0) {
    throw std::invalid_argument(std::string("tp::") + what + ": a tensor of " + c10::str(t.sizes()) +
                                " cannot be split along " + layout_text(layout));
  }
  return t.size(layout.dim) / layout.sections;
}

}  // namespace

Part part_of(int64_t extent, int64_t ranks, int64_t rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks || extent < ranks) {
    throw std::invalid_argument("tp::part_of: an extent of " + std::to_string(extent) + " has no part " +
                                std::to_string(rank) + " of " + std::to_string(ranks) + " (every rank needs one)");
  }
  const int64_t base = extent / ranks, longer = extent % ranks;
  return {rank * base + std::min(rank, longer), base + (rank < longer ? 1 : 0)};
}

at::Tensor slice_of(const at::Tensor& whole, const SplitLayout& layout, int64_t rank, int64_t ranks) {
  const int64_t extent = section_extent(whole, layout, "slice_of");
  if (layout.parts > 0 && (layout.parts > ranks || ranks % layout.parts != 0)) {
    throw std::invalid_argument("tp::slice_of: " + std::to_string(layout.parts) + " parts do not repeat evenly over " +
                                std::to_string(ranks) + " ranks");
  }
  const Part part = part_of(extent, layout.part_count(ranks), layout.part_index(rank, ranks));
  if (layout.sections == 1) return whole.narrow(layout.dim, part.start, part.size);
  std::vector<at::Tensor> pieces;
  for (int64_t s = 0; s < layout.sections; ++s) {
    pieces.push_back(whole.narrow(layout.dim, s * extent + part.start, part.size));
  }
  return at::cat(pieces, layout.dim);
}

at::Tensor merge_parts(const std::vector<at::Tensor>& all, const SplitLayout& layout) {
  if (all.empty()) throw std::invalid_argument("tp::merge_parts: no parts");
  // One rank's of each part: replicated parts are alike.
  std::vector<at::Tensor> parts;
  const int64_t ranks = static_cast<int64_t>(all.size());
  for (int64_t r = 0; r < ranks; ++r) {
    if (r == 0 || layout.part_index(r, ranks) != layout.part_index(r - 1, ranks)) parts.push_back(all[r]);
  }
  if (layout.sections == 1) return at::cat(parts, layout.dim);
  // Section s of the whole is section s of every part, in rank order.
  std::vector<at::Tensor> pieces;
  for (int64_t s = 0; s < layout.sections; ++s) {
    for (const at::Tensor& part : parts) {
      const int64_t extent = section_extent(part, layout, "merge_parts");
      pieces.push_back(part.narrow(layout.dim, s * extent, extent));
    }
  }
  return at::cat(pieces, layout.dim);
}

}  // namespace shardtrain::tp
