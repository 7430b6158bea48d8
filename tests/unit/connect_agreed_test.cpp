// A group's connect agreed over the store: ranks as threads over one in-process store, real Gloo backends on
// loopback. A rank whose connect fails makes every rank try again (the others time out waiting for it in their
// own connect); a rank that fails every time, or says nothing, makes every rank throw naming it.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distributed/backends.h"
#include "distributed/connect_agreed.h"

namespace shardtrain::dist {
namespace {

constexpr int kSize = 3;
// An attempt a rank fails is waited out by the others (their connects time out), so each test takes a timeout per
// failed attempt; the attempt that succeeds must connect 3 ranks within it, which a loaded machine does in far
// less than 3 s. The silent rank's test waits its own, shorter, timeout out twice.
constexpr std::chrono::milliseconds kTimeout{3000}, kSilentTimeout{1000};

struct RankResult {
  c10::intrusive_ptr<c10d::Backend> backend;
  std::string error;
  int attempts = 0;
};

// Every rank in its own thread; `failing(rank, attempt)` makes that rank's connect throw at once; `silent` names a
// rank that never takes part.
template <typename Failing>
std::vector<RankResult> connect_all(Failing failing, int attempts, int silent = -1,
                                    std::chrono::milliseconds timeout = kTimeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankResult> results(kSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    if (rank == silent) continue;
    threads.emplace_back([&, rank] {
      RankResult& out = results[static_cast<size_t>(rank)];
      try {
        out.backend = connect_agreed(store, rank, kSize, attempts, timeout, "test",
                                     [&](const c10::intrusive_ptr<c10d::Store>& attempt_store) {
                                       if (failing(rank, out.attempts++)) throw std::runtime_error("injected fault");
                                       return make_gloo_backend(attempt_store, rank, kSize, timeout, "127.0.0.1", 1);
                                     });
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(ConnectAgreed, OneRankFailingMakesAllTryAgain) {
  const auto results = connect_all([](int rank, int attempt) { return rank == 1 && attempt == 0; }, 3);
  std::vector<std::thread> threads;
  std::vector<at::Tensor> sums(kSize);
  for (int rank = 0; rank < kSize; ++rank) {
    const RankResult& r = results[static_cast<size_t>(rank)];
    ASSERT_TRUE(r.error.empty()) << "rank " << rank << ": " << r.error;
    EXPECT_EQ(r.attempts, 2) << "rank " << rank;
    threads.emplace_back([&, rank] {  // the backends of the second attempt work together
      std::vector<at::Tensor> t{at::full({4}, static_cast<double>(rank + 1))};
      results[static_cast<size_t>(rank)].backend->allreduce(t)->wait();
      sums[static_cast<size_t>(rank)] = t[0];
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kSize; ++rank) EXPECT_TRUE(at::equal(sums[static_cast<size_t>(rank)], at::full({4}, 6.0)));
}

TEST(ConnectAgreed, ARankFailingEveryTimeIsNamedOnEveryRank) {
  const auto results = connect_all([](int rank, int) { return rank == 1; }, 2);
  for (int rank = 0; rank < kSize; ++rank) {
    const std::string& e = results[static_cast<size_t>(rank)].error;
    EXPECT_NE(e.find("group 'test' did not connect on every rank in 2 attempts"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1: failed: injected fault"), std::string::npos) << e;
  }
}

TEST(ConnectAgreed, ARankSayingNothingIsNamed) {
  const auto results = connect_all([](int, int) { return false; }, 3, /*silent=*/2, kSilentTimeout);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string& e = results[static_cast<size_t>(rank)].error;
    EXPECT_NE(e.find("group 'test': rank(s) 2 said nothing about connecting within 2000 ms"), std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace shardtrain::dist
