#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <optional>

#include "support/skip_code.h"
#include "test_env.h"

namespace shardtrain::testing {
namespace {
std::optional<dist::ProcessGroup>& slot() {
  static std::optional<dist::ProcessGroup> pg;  // set once in main, before any test runs
  return pg;
}
}  // namespace

dist::ProcessGroup& test_process_group() { return *slot(); }

}  // namespace shardtrain::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Listing the tests (house.multiprocess_suites_listed) needs no process group, and runs outside the launcher.
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  using namespace shardtrain;
  dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
  dist::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(120);
  shardtrain::testing::slot() = dist::ProcessGroup::init(env, options);
  // Rank 0 prints the whole report; the others print only their failures (GTEST_BRIEF).
  if (env.rank != 0) ::testing::GTEST_FLAG(brief) = true;
  const int result = RUN_ALL_TESTS();
  // A rank that failed must not leave the others waiting in a barrier forever: the barrier has the group timeout.
  shardtrain::testing::test_process_group().world().barrier().wait();
  return shardtrain::testing::skipped_or(result);
}
