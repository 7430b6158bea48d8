// How a tensor-parallel parameter divides (tp/split.h): parts as even as they can be, a fused projection's sections
// split alike, and merging the parts gives back the whole. The split regions' random streams (tp/rng_fork.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/tp/rng_fork.h"
#include "shardtrain/tp/split.h"
#include "support/expect_error.h"

namespace shardtrain::tp {
namespace {

TEST(TpSplit, PartsAreAsEvenAsTheyCanBe) {
  // 1001 rows over 4 ranks: the first one longer; the parts tile the extent.
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 251}, {251, 250}, {501, 250}, {751, 250}};
  for (int64_t r = 0; r < 4; ++r) {
    const Part p = part_of(1001, 4, r);
    EXPECT_EQ(p.start, expected[r].first) << r;
    EXPECT_EQ(p.size, expected[r].second) << r;
  }
  EXPECT_EQ(part_of(64, 2, 1).start, 32);
  testing::expect_error<std::invalid_argument>([] { part_of(3, 4, 0); }, {"extent of 3", "every rank needs one"});
}

TEST(TpSplit, SlicesMergeBackToTheWhole) {
  const at::Tensor whole = at::arange(2 * 12, at::kFloat).view({2, 12});
  for (const SplitLayout layout : {SplitLayout{1, 1}, SplitLayout{1, 3}, SplitLayout{0, 1}}) {
    for (int64_t ranks : {1, 2, 4}) {
      if (whole.size(layout.dim) / layout.sections < ranks) continue;
      std::vector<at::Tensor> parts;
      for (int64_t r = 0; r < ranks; ++r) parts.push_back(slice_of(whole, layout, r, ranks));
      EXPECT_TRUE(at::equal(merge_parts(parts, layout), whole)) << layout.dim << " " << layout.sections << " " << ranks;
    }
  }
  // Three sections (q, k, v) of 4 columns over 2 ranks: rank 1 holds columns 2-3 of each.
  const at::Tensor row = at::arange(12, at::kFloat);
  EXPECT_TRUE(at::equal(slice_of(row, {0, 3}, 1, 2), at::tensor({2.f, 3.f, 6.f, 7.f, 10.f, 11.f})));
  // Uneven: 5 rows over 2 ranks, 3 + 2.
  const at::Tensor five = at::arange(5, at::kFloat);
  EXPECT_EQ(slice_of(five, {0, 1}, 0, 2).numel(), 3);
  EXPECT_TRUE(at::equal(merge_parts({slice_of(five, {0, 1}, 0, 2), slice_of(five, {0, 1}, 1, 2)}, {0, 1}), five));
  // Two key/value heads of 2 rows over 4 ranks: ranks 0 and 1 hold the first, 2 and 3 the second; merged from the
  // first of each.
  const at::Tensor kv = at::arange(4, at::kFloat);
  std::vector<at::Tensor> held;
  for (int64_t r = 0; r < 4; ++r) held.push_back(slice_of(kv, {0, 1, 2}, r, 4));
  EXPECT_TRUE(at::equal(held[1], at::tensor({0.f, 1.f})));
  EXPECT_TRUE(at::equal(held[2], at::tensor({2.f, 3.f})));
  EXPECT_TRUE(at::equal(merge_parts(held, {0, 1, 2}), kv));
  testing::expect_error<std::invalid_argument>([&] { slice_of(kv, {0, 1, 3}, 0, 4); },
                                               {"3 parts do not repeat evenly over 4 ranks"});
  testing::expect_error<std::invalid_argument>([&] { slice_of(five, {0, 3}, 0, 2); },
                                               {"tp::slice_of", "[5]", "dimension 0 in 3 sections"});
  testing::expect_error<std::invalid_argument>([&] { slice_of(five, {1, 1}, 0, 2); }, {"along dimension 1"});
}

// Two ranks of a group (seeded alike) in a fork draw different numbers; the same rank from the same state draws the
// same (activation checkpointing's replay); after it both continue alike, and not as the fork drew.
TEST(TpRngFork, EachRankDrawsItsOwnAndTheGroupContinuesAlike) {
  const c10::Device cpu(c10::kCPU);
  struct Draws {
    at::Tensor in_fork, after;
  };
  auto draw = [&](int64_t rank) {
    at::manual_seed(11);
    Draws d;
    {
      const RngFork fork(cpu, rank);
      d.in_fork = at::rand({64});
    }
    d.after = at::rand({64});
    return d;
  };
  const Draws rank0 = draw(0), rank1 = draw(1), again = draw(1);
  EXPECT_FALSE(at::equal(rank0.in_fork, rank1.in_fork));
  EXPECT_TRUE(at::equal(rank1.in_fork, again.in_fork));
  EXPECT_TRUE(at::equal(rank0.after, rank1.after));
  EXPECT_FALSE(at::equal(rank0.after, rank0.in_fork));
  at::manual_seed(11);
  EXPECT_FALSE(at::equal(at::rand({64}), rank0.in_fork));  // not the stream outside forks either
  // Forks from different states (consecutive regions) draw differently.
  at::manual_seed(11);
  at::Tensor first, second;
  {
    const RngFork fork(cpu, 0);
    first = at::rand({64});
  }
  {
    const RngFork fork(cpu, 0);
    second = at::rand({64});
  }
  EXPECT_FALSE(at::equal(first, second));
}

}  // namespace
}  // namespace shardtrain::tp
