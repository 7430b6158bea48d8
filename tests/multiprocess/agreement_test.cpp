// How the ranks agree on what one of them saw, at world sizes 1-4: whose loss was not finite (train_step's check
// before any rank steps), and the first failure of a write (a save that failed on one rank fails on all, with that
// rank's reason).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace shardtrain
