// Rendezvous failures name the address that did not answer, the rank and the timeout; world size 1 needs nothing.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <iostream>

#include "shardtrain/dist/process_group.h"

namespace shardtrain::dist {
namespace {

// A loopback port that nothing listens on: bind one, read its number, close it.
int unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

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
  env.master_port = unused_port();
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
  env.master_port = unused_port();
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
