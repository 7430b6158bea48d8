// The elastic rendezvous's rounds (lib/core/src/launch/elastic_rendezvous.h), its nodes as threads over one store:
// a round closes at MAX at once, or at MIN after the last call; a node that comes after the close goes to the next
// round and ends the running one; a failure or a node that stops beating ends the round for the others; a round
// that never reaches MIN times out saying how many came.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "launch/elastic_rendezvous.h"

namespace shardtrain::launch {
namespace {

using namespace std::chrono_literals;

// A last call long enough that a round closing at MAX is told apart from one closing after it, under load too.
ElasticOptions options_of(int min_nodes, int max_nodes, const std::string& name) {
  ElasticOptions o;
  o.min_nodes = min_nodes, o.max_nodes = max_nodes;
  o.last_call = 1500ms, o.join_timeout = 20s, o.keep_alive_interval = 50ms, o.keep_alive_max_attempt = 4;
  o.node_name = name;
  return o;
}

// Each of `nodes` joins (from its own thread) and returns its membership.
std::vector<Membership> join_all(std::vector<ElasticRendezvous*> nodes) {
  std::vector<std::future<Membership>> joined;
  for (ElasticRendezvous* node : nodes) joined.push_back(std::async(std::launch::async, [node] { return node->join(); }));
  std::vector<Membership> out;
  for (auto& f : joined) out.push_back(f.get());
  return out;
}

std::vector<int> ranks_of(const std::vector<Membership>& ms) {
  std::vector<int> ranks;
  for (const Membership& m : ms) ranks.push_back(m.node_rank);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

TEST(ElasticRendezvous, RoundsCloseAtMaxOrAtMinAfterTheLastCall) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ElasticRendezvous a(store, options_of(2, 3, "a")), b(store, options_of(2, 3, "b")), c(store, options_of(2, 3, "c"));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Membership> three = join_all({&a, &b, &c});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1000ms);  // full: no last call
  EXPECT_EQ(ranks_of(three), (std::vector<int>{0, 1, 2}));
  for (const Membership& m : three) {
    EXPECT_EQ(m.round, 0);
    EXPECT_EQ(m.nnodes, 3);
  }
  // Round 0 ends (c's worker failed); a and b meet again in round 1, as two after the last call.
  c.end(0, "node 2 (c): rank 2 exited with code 1");
  EXPECT_EQ(a.ended(three[0]), "node 2 (c): rank 2 exited with code 1");
  const auto again = std::chrono::steady_clock::now();
  const std::vector<Membership> two = join_all({&a, &b});
  EXPECT_GE(std::chrono::steady_clock::now() - again, 1500ms);
  EXPECT_EQ(ranks_of(two), (std::vector<int>{0, 1}));
  for (const Membership& m : two) {
    EXPECT_EQ(m.round, 1);
    EXPECT_EQ(m.nnodes, 2);
  }
  EXPECT_EQ(a.ended(two[0]), "");
  // c comes back after round 1 closed: it goes to round 2, which ends round 1 for a and b; then all three meet.
  auto late = std::async(std::launch::async, [&] { return c.join(); });
  std::string why;
  for (const auto deadline = std::chrono::steady_clock::now() + 10s;
       why.empty() && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(10ms)) {
    why = b.ended(two[1]);
  }
  EXPECT_EQ(why, "a node joined rendezvous round 2");
  const std::vector<Membership> back = join_all({&a, &b});
  const Membership c_back = late.get();
  EXPECT_EQ(c_back.round, 2);
  for (const Membership& m : back) {
    EXPECT_EQ(m.round, 2);
    EXPECT_EQ(m.nnodes, 3);
  }
}

TEST(ElasticRendezvous, ANodeThatStopsBeatingIsLost) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ElasticRendezvous a(store, options_of(2, 2, "a")), b(store, options_of(2, 2, "b"));
  const std::vector<Membership> ms = join_all({&a, &b});
  // a beats and watches; b never beats again (its launcher gone): a says so within 4 intervals, and ends the round.
  std::string why;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (why.empty() && std::chrono::steady_clock::now() < deadline) {
    why = a.ended(ms[0]);  // join_all's are in the order of the nodes given
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(why.find(") lost: no keep-alive for "), std::string::npos) << why;
  EXPECT_NE(why.find("(b)"), std::string::npos) << why;
  EXPECT_EQ(b.ended(ms[1]), why);  // the round is over for b too
}

TEST(ElasticRendezvous, ARoundBelowMinTimesOutSayingHowManyCame) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ElasticOptions o = options_of(2, 3, "alone");
  o.join_timeout = 200ms;
  ElasticRendezvous alone(store, o);
  try {
    alone.join();
    FAIL() << "joined alone";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has 1 of the 2 nodes it needs at least (--nnodes 2:3)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ElasticRendezvous(store, options_of(3, 2, "x")), std::invalid_argument);
}

}  // namespace
}  // namespace shardtrain::launch
