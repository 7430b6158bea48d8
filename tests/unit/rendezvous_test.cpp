// Rendezvous failures name the address that did not answer, the rank and the timeout; world size 1 needs nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>

#include "shardtrain/distributed/process_group.h"
#include "support/free_port.h"
#include "support/expect_error.h"

namespace shardtrain::dist {
namespace {

using shardtrain::testing::free_loopback_port;

TEST(Rendezvous, WorldSizeOneNeedsNoNetwork) {
  ProcessGroup pg = ProcessGroup::init(DistEnv{});
  EXPECT_EQ(pg.world_size(), 1);
  EXPECT_EQ(pg.world().backend(), CommBackend::SELF);
  auto group = pg.new_group({0}, "solo");
  ASSERT_TRUE(group.has_value());
  EXPECT_EQ(group->size(), 1);
}

TEST(Rendezvous, UnansweredAddressIsNamed) {
  DistEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = free_loopback_port();
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(2);
  const std::string what = shardtrain::testing::expect_error<std::runtime_error>(
      [&] { ProcessGroup::init(env, options); },
      {"rank 1 of 2", "MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + std::to_string(env.master_port), "within 2.0 s"});
  std::cout << "  the user sees: " << what << "\n";
}

TEST(Rendezvous, ServerWaitingForMissingRanksTimesOut) {
  DistEnv env;
  env.rank = 0;
  env.world_size = 3;
  env.master_addr = "127.0.0.1";
  env.master_port = free_loopback_port();
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(2);
  shardtrain::testing::expect_error<std::runtime_error>(
      [&] { ProcessGroup::init(env, options); },
      {"rendezvous failed on rank 0 of 3 at 127.0.0.1:", "ranks 1, 2 did not arrive within 2.0 s"});
}

TEST(Rendezvous, BadOptionsAreRejected) {
  DistEnv env;
  env.rank = 2;
  env.world_size = 2;
  EXPECT_THROW(ProcessGroup::init(env), std::invalid_argument);
  ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(0);
  EXPECT_THROW(ProcessGroup::init(DistEnv{}, options), std::invalid_argument);
}

}  // namespace
}  // namespace shardtrain::dist
