#include "shardtrain/distributed/text_exchange.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>

namespace shardtrain::dist {
namespace {

at::TensorOptions on(const Communicator& group, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(group.device());
}

}  // namespace

std::vector<std::string> all_gather_text(const Communicator& group, const std::string& text) {
  const int64_t W = group.size();
  const at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), on(group, at::kLong));
  const at::Tensor lengths = at::empty({W}, on(group, at::kLong));
  group.all_gather(lengths, length).wait();
  const at::Tensor sizes = lengths.cpu();
  const int64_t longest = std::max<int64_t>(1, sizes.max().item<int64_t>());
  at::Tensor mine = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(mine.data_ptr<uint8_t>(), text.data(), text.size());
  const at::Tensor all = at::empty({W * longest}, on(group, at::kByte));
  group.all_gather(all, mine.to(group.device())).wait();
  const at::Tensor bytes = all.cpu();
  std::vector<std::string> out;
  for (int64_t r = 0; r < W; ++r) {
    const char* start = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()) + r * longest;
    out.emplace_back(start, static_cast<size_t>(sizes[r].item<int64_t>()));
  }
  return out;
}

std::string first_failure(const Communicator& group, const std::string& text) {
  if (group.size() == 1) return text;
  for (const std::string& t : all_gather_text(group, text)) {
    if (!t.empty()) return t;
  }
  return "";
}

std::string failure_text(const Communicator& group, const std::string& what) {
  if (what.empty()) return "";
  return "rank " + std::to_string(group.global_ranks()[static_cast<size_t>(group.rank())]) + ": " + what;
}

std::string broadcast_text(const Communicator& group, const std::string& text, int root) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), on(group, at::kLong));
  group.broadcast(length, root).wait();
  const int64_t n = length.cpu().item<int64_t>();
  at::Tensor bytes = at::zeros({std::max<int64_t>(1, n)}, at::TensorOptions().dtype(at::kByte));
  if (group.rank() == root) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  bytes = bytes.to(group.device());
  group.broadcast(bytes, root).wait();
  const at::Tensor host = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

}  // namespace shardtrain::dist
