// How the ranks agree on what one of them saw, at world sizes 1-4: whose loss was not finite (train_step's check
// before any rank steps), the first failure of a write (a save that failed on one rank fails on all, with that
// rank's reason), and which replica's parameters differ (parallel.check_replicas_every).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstring>

#include "shardtrain/distributed/replica_check.h"
#include "shardtrain/distributed/text_exchange.h"
#include "test_env.h"
#include "train/train_step.h"

namespace shardtrain {
namespace {

using testing::test_process_group;

TEST(Agreement, EveryRankLearnsWhoseLossWasNotFinite) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size(), me = world.rank();
  EXPECT_EQ(train::nonfinite_ranks(false, world), "");
  EXPECT_EQ(train::nonfinite_ranks(true, world), w == 1 ? "rank 0" : "every rank");
  EXPECT_EQ(train::nonfinite_ranks(me == w - 1, world), w == 1 ? "rank 0" : "rank " + std::to_string(w - 1));
  if (w >= 3) {
    EXPECT_EQ(train::nonfinite_ranks(me % 2 == 1, world), w == 3 ? "rank 1" : "ranks 1, 3");
    EXPECT_EQ(train::nonfinite_ranks(me != 1, world), w == 3 ? "ranks 0, 2" : "ranks 0, 2, 3");
  }
}

TEST(Agreement, EveryRankGetsTheFirstFailure) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size(), me = world.rank();
  EXPECT_EQ(dist::first_failure(world, dist::failure_text(world, "")), "");
  // The last rank fails, then every rank from the second on: the lowest failing rank's reason, named.
  EXPECT_EQ(dist::first_failure(world, dist::failure_text(world, me == w - 1 ? "disk full" : "")),
            "rank " + std::to_string(w - 1) + ": disk full");
  const std::string mine = me >= 1 ? "cannot write shard " + std::to_string(me) : "";
  EXPECT_EQ(dist::first_failure(world, dist::failure_text(world, mine)), w == 1 ? "" : "rank 1: cannot write shard 1");
}

// Replicas holding the same tensors agree; one bit flipped in the last rank's copy of a tensor (a float32 and a
// bf16 one) names that rank and that tensor on every rank — the odd one out of three or more, or at two ranks the
// one that is not rank 0 — and two flipped tensors are counted, the first named.
TEST(Agreement, ReplicasNameTheRankWhoseParametersDiffer) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size(), me = world.rank();
  torch::manual_seed(5);  // the same values on every rank
  std::vector<std::pair<std::string, at::Tensor>> named = {
      {"embed.weight", torch::randn({8, 4})},
      {"layers.0.mlp.up.weight", torch::randn({6, 4})},
      {"layers.0.norm.weight", torch::randn({4}).to(at::kBFloat16)}};
  EXPECT_FALSE(dist::compare_replicas(named, world).has_value());
  if (w == 1) return;
  auto flip = [](at::Tensor& t, int64_t element) {  // one bit of one element's bytes
    auto* bytes = static_cast<uint8_t*>(t.data_ptr()) + element * t.element_size();
    bytes[0] ^= 0x10;
  };
  std::string others;
  for (int r = 0; r + 1 < w; ++r) others += (others.empty() ? "" : ", ") + std::to_string(r);
  if (me == w - 1) flip(named[2].second, 1);
  const auto one = dist::compare_replicas(named, world);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->tensor, "layers.0.norm.weight");
  EXPECT_EQ(one->odd_ranks, std::vector<int>{w - 1});
  EXPECT_EQ(dist::describe(*one), "rank " + std::to_string(w - 1) + " holds another layers.0.norm.weight than " +
                                      (w == 2 ? "rank " : "ranks ") + others + " (the only tensor that differs)");
  if (me == w - 1) flip(named[1].second, 7);
  const auto two = dist::compare_replicas(named, world);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->tensor, "layers.0.mlp.up.weight");
  EXPECT_EQ(two->tensors_differing, 2);
  EXPECT_NE(dist::describe(*two).find("(the first of 2 tensors that differ)"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain
