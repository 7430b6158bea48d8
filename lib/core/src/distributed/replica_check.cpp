#include "shardtrain/distributed/replica_check.h"

#include <ATen/ATen.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>
#include <map>
#include <stdexcept>

namespace shardtrain::dist {
namespace {

// XXH3-64 of a tensor's bytes in its own dtype (a copy to the host for a device tensor), as an int64 for the
// collective.
int64_t hash_of(const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU).contiguous();
  const uint64_t h = XXH3_64bits(host.data_ptr(), host.nbytes());
  int64_t out = 0;
  static_assert(sizeof out == sizeof h);
  std::memcpy(&out, &h, sizeof h);
  return out;
}

}  // namespace

std::optional<ReplicaMismatch> compare_replicas(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                const Communicator& replicas) {
  const int world = replicas.size();
  const auto n = static_cast<int64_t>(tensors.size());
  // The count first, so that ranks holding different tensors fail by name instead of in the gather.
  at::Tensor counts = at::empty({world}, at::kLong).to(replicas.device());
  replicas.all_gather(counts, at::full({1}, n, at::kLong).to(replicas.device())).wait();
  const at::Tensor all_counts = counts.cpu();
  for (int r = 0; r < world; ++r) {
    if (all_counts[r].item<int64_t>() != n) {
      throw std::invalid_argument("compare_replicas: rank " + std::to_string(replicas.global_ranks()[r]) + " has " +
                                  std::to_string(all_counts[r].item<int64_t>()) + " tensors, this rank " +
                                  std::to_string(n) + " (expected replicas of one model)");
    }
  }
  if (n == 0) return std::nullopt;
  std::vector<int64_t> mine;
  mine.reserve(tensors.size());
  for (const auto& [name, t] : tensors) mine.push_back(hash_of(t));
  at::Tensor gathered = at::empty({world * n}, at::kLong).to(replicas.device());
  replicas.all_gather(gathered, at::tensor(mine, at::kLong).to(replicas.device())).wait();
  const at::Tensor hashes = gathered.cpu().view({world, n});
  const int64_t* h = hashes.data_ptr<int64_t>();
  std::optional<ReplicaMismatch> out;
  for (int64_t k = 0; k < n; ++k) {
    std::map<int64_t, int> votes;
    for (int r = 0; r < world; ++r) ++votes[h[r * n + k]];
    if (votes.size() == 1) continue;
    if (out) {
      ++out->tensors_differing;
      continue;
    }
    // The most common hash, the first rank's among equals: who holds another is odd.
    int64_t common = h[k];
    for (const auto& [hash, count] : votes) {
      if (count > votes[common]) common = hash;
    }
    out = ReplicaMismatch{tensors[static_cast<size_t>(k)].first, {}, {}, 1};
    for (int r = 0; r < world; ++r) {
      (h[r * n + k] == common ? out->agreeing_ranks : out->odd_ranks).push_back(replicas.global_ranks()[r]);
    }
  }
  return out;
}

std::string describe(const ReplicaMismatch& m) {
  return ranks_text(m.odd_ranks) + (m.odd_ranks.size() == 1 ? " holds" : " hold") + " another " + m.tensor +
         " than " + ranks_text(m.agreeing_ranks) +
         (m.tensors_differing == 1 ? " (the only tensor that differs)"
                                   : " (the first of " + std::to_string(m.tensors_differing) + " tensors that differ)");
}

}  // namespace shardtrain::dist
