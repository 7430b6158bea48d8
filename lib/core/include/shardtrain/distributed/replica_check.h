// Replicas that check each other (torchft's and NVRx's concern: silent data corruption on a large fleet): ranks that
// should hold identical tensors — DDP's data-parallel ranks, HSDP's and NO_SHARD's replicate group — compare a
// 64-bit hash of each (XXH3 over its bytes) in one all-gather of n hashes a rank, and name the first that differs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::dist {

struct ReplicaMismatch {
  std::string tensor;               // the first, in the order given, whose hashes differ
  std::vector<int> odd_ranks;       // global ranks whose hash of it is not the most common (ties: not the first's)
  std::vector<int> agreeing_ranks;  // the others
  int64_t tensors_differing = 0;    // of all given
};

// Collective over `replicas`: every rank passes the same names in the same order. Nothing when every tensor's hash
// is the same on every rank. Throws std::invalid_argument when the ranks pass different numbers of tensors.
std::optional<ReplicaMismatch> compare_replicas(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                const Communicator& replicas);

// "ranks 1, 3 hold another layers.2.mlp.up.weight than ranks 0, 2 (the first of 4 tensors that differ)".
std::string describe(const ReplicaMismatch& m);

}  // namespace shardtrain::dist
