// Rendezvous failures name the address that did not answer, the rank and the timeout; world size 1 needs nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>

#include "shardtrain/dist/process_group.h"
#include "support/free_port.h"

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
  InitOptions options;
  options.timeout = std::chrono::seconds(2);
  try {
    ProcessGroup::init(env, options);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    std::cout << "  the user sees: " << what << "\n";
    EXPECT_NE(what.find("rank 1 of 2"), std::string::npos) << what;
    EXPECT_NE(what.find("MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + std::to_string(env.master_port)), std::string::npos)
        << what;
    EXPECT_NE(what.find("within 2.0 s"), std::string::npos) << what;
  }
}

TEST(Rendezvous, ServerWaitingForMissingRanksTimesOut) {
  DistEnv env;
  env.rank = 0;
  env.world_size = 3;
  env.master_addr = "127.0.0.1";
  env.master_port = free_loopback_port();
  InitOptions options;
  options.timeout = std::chrono::seconds(2);
  try {
    ProcessGroup::init(env, options);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for 2 other rank(s)"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, BadOptionsAreRejected) {
  DistEnv env;
  env.rank = 2;
  env.world_size = 2;
  EXPECT_THROW(ProcessGroup::init(env), std::invalid_argument);
  InitOptions options;
  options.timeout = std::chrono::milliseconds(0);
  EXPECT_THROW(ProcessGroup::init(DistEnv{}, options), std::invalid_argument);
}

}  // namespace
}  // namespace shardtrain::dist
