// Every collective x dtype x world size (the binary runs at W = 1..4 under the launcher), on per-rank sizes that
// are odd, prime or 1, checked against values every rank computes locally for every other rank.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "test_env.h"
#include "shardtrain/distributed/communicator.h"
#include "shardtrain/memory/memory_stats.h"
#include "support/expect_error.h"

namespace shardtrain::dist {
namespace {

using testing::test_process_group;

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};
const std::vector<int64_t> kSizes = {1, 3, 17, 1001, 40009};

// Rank r's value at flat index i: small integers, so that sums over 4 ranks are exact even in bfloat16, and
// varying over both r and i so that a misplaced chunk shows.
at::Tensor rank_values(int r, int64_t n, int64_t offset = 0) {
  at::Tensor i = at::arange(offset, offset + n, at::kDouble);
  return at::remainder(i * (r + 1) + 3 * r, 13.0) - 6.0;  // in [-6, 6]
}

// Relative tolerance of a dtype for values that went through a mean (W = 3 makes it inexact).
double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return 1e-2;
    case at::kHalf: return 1e-3;
    case at::kFloat: return 1e-6;
    default: return 1e-12;
  }
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype, const std::string& what) {
  at::Tensor a = actual.to(at::kDouble).view(-1);
  at::Tensor e = expected.to(dtype).to(at::kDouble).view(-1);  // the expected value as the dtype can hold it
  ASSERT_EQ(a.numel(), e.numel()) << what;
  const bool ok = at::allclose(a, e, tolerance(dtype), tolerance(dtype));
  EXPECT_TRUE(ok) << what << ": max |diff| " << (a - e).abs().max().item<double>();
}

// The reduction of `stacked` (W, n) over ranks, computed locally in float64.
at::Tensor reduce_locally(const at::Tensor& stacked, ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return stacked.sum(0);
    case ReduceOp::MEAN: return stacked.mean(0);
    case ReduceOp::MAX: return std::get<0>(stacked.max(0));
  }
  throw std::invalid_argument("unknown op");
}

std::string label(const char* op, at::ScalarType dtype, int64_t n) {
  return std::string(op) + " " + c10::toString(dtype) + " n=" + std::to_string(n) + " W=" +
         std::to_string(test_process_group().world_size());
}

TEST(Collectives, AllGather) {
  const Communicator& comm = test_process_group().world();
  const int w = comm.size(), me = comm.rank();
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {
      at::Tensor in = rank_values(me, n).to(dtype);
      at::Tensor out = at::full({w * n}, 99.0, at::TensorOptions().dtype(dtype));
      comm.all_gather(out, in).wait();
      std::vector<at::Tensor> expected;
      for (int r = 0; r < w; ++r) expected.push_back(rank_values(r, n));
      expect_close(out, at::cat(expected), dtype, label("all_gather", dtype, n));
    }
  }
}

TEST(Collectives, ReduceScatterSumMeanMax) {
  const Communicator& comm = test_process_group().world();
  const int w = comm.size(), me = comm.rank();
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MEAN, ReduceOp::MAX}) {
    for (auto dtype : kDtypes) {
      for (int64_t n : kSizes) {
        at::Tensor in = rank_values(me, w * n).to(dtype);
        at::Tensor out = at::full({n}, 99.0, at::TensorOptions().dtype(dtype));
        comm.reduce_scatter(out, in, op).wait();
        std::vector<at::Tensor> mine;  // every rank's chunk `me`
        for (int r = 0; r < w; ++r) mine.push_back(rank_values(r, n, me * n));
        at::Tensor expected = reduce_locally(at::stack(mine), op);
        expect_close(out, expected, dtype, label(reduce_op_name(op), dtype, n) + " reduce_scatter");
      }
    }
  }
}

TEST(Collectives, ReduceScatterReceivesIntoTwoShardsAtMost) {
  // Gloo's reduce-scatter (ours) receives each peer's chunk into one of two shard-sized buffers, in turn, and
  // sums bf16 in a float32 shard, a slice of 2^20 elements at a time: beyond its input and output it allocates at
  // most two shards (one with a single peer), the accumulator and one slice's float32 copy, whatever the world
  // size. (An all-to-all receives a buffer as large as the input.)
  const Communicator& comm = test_process_group().world();
  const int w = comm.size();
  if (w == 1) GTEST_SKIP() << "a world of one receives nothing";
  memory::install_cpu_memory_counter();
  const int64_t n = (int64_t{1} << 21) + 3;  // two slices and a few elements
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor in = rank_values(comm.rank(), w * n).to(dtype);
    at::Tensor out = at::empty({n}, in.options());
    const int64_t before = memory::cpu_memory_stats().current_bytes;
    memory::reset_cpu_peak();
    comm.reduce_scatter(out, in, ReduceOp::SUM).wait();
    const int64_t extra = memory::cpu_memory_stats().peak_bytes - before;
    // What the memory model counts (dist::reduce_scatter_scratch_bytes) is what the reduction allocates.
    const int64_t scratch = reduce_scatter_scratch_bytes(CommBackend::GLOO, n, w, c10::elementSize(dtype));
    EXPECT_LE(extra, scratch + 4096) << c10::toString(dtype) << " W=" << w << ": bytes allocated by the reduction";
    EXPECT_GE(extra, scratch - 4096) << c10::toString(dtype) << " W=" << w << ": bytes allocated by the reduction";
    std::vector<at::Tensor> mine;
    for (int r = 0; r < w; ++r) mine.push_back(rank_values(r, n, comm.rank() * n));
    expect_close(out, at::stack(mine).sum(0), dtype, label("SUM", dtype, n) + " reduce_scatter");
  }
}

TEST(Collectives, AllReduceSumMeanMax) {
  const Communicator& comm = test_process_group().world();
  const int w = comm.size(), me = comm.rank();
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MEAN, ReduceOp::MAX}) {
    for (auto dtype : kDtypes) {
      for (int64_t n : kSizes) {
        at::Tensor t = rank_values(me, n).to(dtype);
        comm.all_reduce(t, op).wait();
        std::vector<at::Tensor> all;
        for (int r = 0; r < w; ++r) all.push_back(rank_values(r, n));
        at::Tensor expected = reduce_locally(at::stack(all), op);
        expect_close(t, expected, dtype, label(reduce_op_name(op), dtype, n) + " all_reduce");
      }
    }
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const Communicator& comm = test_process_group().world();
  for (int root = 0; root < comm.size(); ++root) {
    for (auto dtype : kDtypes) {
      for (int64_t n : kSizes) {
        at::Tensor t = rank_values(comm.rank(), n).to(dtype);
        comm.broadcast(t, root).wait();
        expect_close(t, rank_values(root, n), dtype, label("broadcast", dtype, n) + " root " + std::to_string(root));
      }
    }
  }
}

TEST(Collectives, AllToAll) {
  const Communicator& comm = test_process_group().world();
  const int w = comm.size(), me = comm.rank();
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {
      at::Tensor in = rank_values(me, w * n).to(dtype);
      at::Tensor out = at::full({w * n}, 99.0, at::TensorOptions().dtype(dtype));
      comm.all_to_all(out, in).wait();
      std::vector<at::Tensor> expected;  // chunk j came from rank j's chunk `me`
      for (int j = 0; j < w; ++j) expected.push_back(rank_values(j, n, me * n));
      expect_close(out, at::cat(expected), dtype, label("all_to_all", dtype, n));
    }
  }
}

TEST(Collectives, ManyInFlightBeforeAnyWait) {
  // Overlap depends on issuing several operations and waiting later: results must still land where they belong.
  const Communicator& comm = test_process_group().world();
  const int w = comm.size(), me = comm.rank();
  const int64_t n = 4099;
  std::vector<at::Tensor> gathered, scattered, reduced;
  std::vector<Work> works;
  for (int k = 0; k < 6; ++k) {
    gathered.push_back(at::empty({w * n}));
    works.push_back(comm.all_gather(gathered.back(), rank_values(me + k, n).to(at::kFloat)));
    scattered.push_back(at::empty({n}));
    works.push_back(comm.reduce_scatter(scattered.back(), rank_values(me + k, w * n).to(at::kFloat), ReduceOp::SUM));
    reduced.push_back(rank_values(me, n).to(at::kFloat) * k);
    works.push_back(comm.all_reduce(reduced.back(), ReduceOp::SUM));
  }
  wait_all(works);
  for (int k = 0; k < 6; ++k) {
    std::vector<at::Tensor> g, s, a;
    for (int r = 0; r < w; ++r) {
      g.push_back(rank_values(r + k, n));
      s.push_back(rank_values(r + k, n, me * n));
      a.push_back(rank_values(r, n) * k);
    }
    expect_close(gathered[k], at::cat(g), at::kFloat, "in flight all_gather " + std::to_string(k));
    expect_close(scattered[k], at::stack(s).sum(0), at::kFloat, "in flight reduce_scatter " + std::to_string(k));
    expect_close(reduced[k], at::stack(a).sum(0), at::kFloat, "in flight all_reduce " + std::to_string(k));
  }
}

TEST(Collectives, BarrierHoldsEveryoneUntilTheLastArrives) {
  const Communicator& comm = test_process_group().world();
  if (comm.size() == 1) {
    EXPECT_TRUE(comm.barrier().is_completed());
    return;
  }
  // The last rank arrives 300 ms late; nobody may leave before it arrived. Arrival times are compared on one
  // clock: each rank all-gathers its leave time and the late rank's arrival time (CLOCK_REALTIME is shared by
  // processes of one machine).
  const auto delay = std::chrono::milliseconds(300);
  auto now_ms = [] {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count()) / 1000.0;
  };
  double arrived = 0;
  if (comm.rank() == comm.size() - 1) {
    std::this_thread::sleep_for(delay);
  }
  arrived = now_ms();
  comm.barrier().wait();
  double left = now_ms();
  at::Tensor times = at::empty({2 * comm.size()}, at::kDouble);
  comm.all_gather(times, at::tensor({arrived, left}, at::kDouble)).wait();
  const double last_arrival = times[2 * (comm.size() - 1)].item<double>();
  for (int r = 0; r < comm.size(); ++r) {
    EXPECT_GE(times[2 * r + 1].item<double>(), last_arrival) << "rank " << r << " left the barrier early";
  }
}

TEST(Collectives, WorldSizeOneCopiesNothingItNeedNot) {
  if (test_process_group().world_size() != 1) GTEST_SKIP() << "world size 1 only";
  const Communicator& comm = test_process_group().world();
  EXPECT_EQ(comm.backend(), CommBackend::SELF);
  at::Tensor t = at::arange(10, at::kFloat);
  const void* before = t.data_ptr();
  Work work = comm.all_reduce(t, ReduceOp::MEAN);
  EXPECT_TRUE(work.is_completed());  // nothing was issued
  work.wait();
  EXPECT_EQ(t.data_ptr(), before);
  EXPECT_TRUE(at::equal(t, at::arange(10, at::kFloat)));
  // In place (out and in the same memory): no copy, values unchanged.
  comm.all_gather(t, t).wait();
  comm.reduce_scatter(t, t, ReduceOp::SUM).wait();
  EXPECT_TRUE(at::equal(t, at::arange(10, at::kFloat)));
  // Different memory: exactly one copy.
  at::Tensor out = at::zeros({10});
  comm.all_gather(out, t).wait();
  EXPECT_TRUE(at::equal(out, t));
}

// Point to point around a ring: each rank sends two tensors to the next, tags 7 then 3, while the next posts its
// receives in the other order, and a collective runs between them: each receive gets the send of its tag, and the
// collective's own messages do not mix with either. Every dtype; a peer that is this rank, or a tag out of range,
// is refused by name.
TEST(Collectives, SendAndReceivePairByTag) {
  const Communicator& comm = test_process_group().world();
  const int w = comm.size(), r = comm.rank();
  testing::expect_error<std::invalid_argument>([&] { comm.send(at::zeros({3}), r, 0); },
                                               {"peer " + std::to_string(r) + " is not another rank"});
  if (w == 1) GTEST_SKIP() << "no other rank to send to";
  testing::expect_error<std::invalid_argument>([&] { comm.send(at::zeros({3}), (r + 1) % w, -1); }, {"tag -1"});
  const int next = (r + 1) % w, previous = (r + w - 1) % w;
  for (at::ScalarType dtype : kDtypes) {
    const int64_t n = 1001;
    std::vector<Work> works;
    works.push_back(comm.send(rank_values(r, n).to(dtype), next, 7));
    works.push_back(comm.send(rank_values(r, n, 5).to(dtype), next, 3));
    at::Tensor summed = at::ones({17}, dtype);
    works.push_back(comm.all_reduce(summed, ReduceOp::SUM));
    at::Tensor three = at::empty({n}, dtype), seven = at::empty({n}, dtype);
    works.push_back(comm.recv(three, previous, 3));
    works.push_back(comm.recv(seven, previous, 7));
    wait_all(works);
    expect_close(seven, rank_values(previous, n), dtype, label("recv tag 7", dtype, n));
    expect_close(three, rank_values(previous, n, 5), dtype, label("recv tag 3", dtype, n));
    expect_close(summed, at::full({17}, static_cast<double>(w)), dtype, label("all_reduce between", dtype, 17));
  }
}

TEST(Collectives, BadArgumentsNameTheSizes) {
  const Communicator& comm = test_process_group().world();
  const int w = comm.size();
  testing::expect_error<std::invalid_argument>(
      [&] { comm.all_gather(at::empty({w * 5 + 1}), at::empty({5})); },
      {"output has " + std::to_string(w * 5 + 1) + " elements, expected " + std::to_string(w) + " x 5"});
  EXPECT_THROW(comm.reduce_scatter(at::empty({5}, at::kHalf), at::empty({w * 5}), ReduceOp::SUM),
               std::invalid_argument);
  EXPECT_THROW(comm.all_reduce(at::empty({4, 4}).t(), ReduceOp::SUM), std::invalid_argument);  // not contiguous
  EXPECT_THROW(comm.broadcast(at::empty({4}), w), std::invalid_argument);                      // no such root
}

}  // namespace
}  // namespace shardtrain::dist
