// Collective bandwidth in the style of nccl-tests: all-gather, reduce-scatter and all-reduce over message sizes,
// ours beside the backend's own operation, so the difference is visible. Run through the launcher:
//   build/shardtrain launch --nproc-per-node 4 -- build/comm_bench [--min-bytes 4096] [--max-bytes 16777216]
//
// size is the whole buffer S (all-gather's output, reduce-scatter's input, all-reduce's tensor), float32.
// time is the slowest rank's mean over `iters` (after warm-up); algbw = S / time;
// busbw = algbw * (W-1)/W for all-gather and reduce-scatter, algbw * 2(W-1)/W for all-reduce (nccl-tests'
// PERFORMANCE.md), the rate each rank's link carries for a bandwidth-optimal algorithm. The last column is the
// backend's time over ours: > 1 means ours is faster.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"

namespace {

using namespace shardtrain::dist;
using Clock = std::chrono::steady_clock;

struct Args {
  int64_t min_bytes = 4096;
  int64_t max_bytes = 16 << 20;
  int64_t budget_bytes = 1LL << 30;  // per measurement: iterations = clamp(budget / size, 3, 200)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    int64_t value = std::stoll(argv[i + 1]);
    if (name == "--min-bytes") a.min_bytes = value;
    else if (name == "--max-bytes") a.max_bytes = value;
    else if (name == "--budget-bytes") a.budget_bytes = value;
    else throw std::invalid_argument("unknown option " + name + " (--min-bytes, --max-bytes, --budget-bytes)");
  }
  return a;
}

// Mean seconds per call over `iters`, the slowest rank's (every rank waits for the same collective, so the
// slowest rank's clock is the operation's time).
double time_op(const Communicator& comm, const std::function<Work()>& op, int iters) {
  for (int i = 0; i < 2; ++i) op().wait();
  comm.barrier().wait();
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) op().wait();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iters;
  at::Tensor t = at::tensor({seconds}, at::kDouble);
  comm.all_reduce(t, ReduceOp::MAX).wait();
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse(argc, argv);
    ProcessGroup pg = ProcessGroup::init(read_dist_env(process_env_lookup()));
    const Communicator& comm = pg.world();
    const int w = comm.size();
    const bool print = pg.rank() == 0;
    if (print) {
      std::printf("# shardtrain comm_bench: world %d, backend %s, float32, loopback\n", w,
                  comm_backend_name(comm.backend()));
      std::printf("# all_gather: ours = %s; backend = its _allgather_base\n",
                  comm.backend() == CommBackend::GLOO ? "a broadcast from each rank, in place" : "its _allgather_base");
      std::printf("# reduce_scatter: ours = a send to each rank, summed as they arrive; backend = _reduce_scatter_base\n");
      std::printf("# all_reduce: ours is the backend's all-reduce (no second column)\n");
      std::printf("%-15s %12s %8s | %10s %8s %8s | %10s %8s %8s | %9s\n", "op", "size(B)", "iters", "ours(us)",
                  "algbw", "busbw", "backend", "algbw", "busbw", "speedup");
    }
    for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) {
      const int64_t n = std::max<int64_t>(1, bytes / 4 / w);  // elements per rank
      const int64_t total = n * w;
      const double size = static_cast<double>(total * 4);
      const int iters = static_cast<int>(std::clamp<int64_t>(args.budget_bytes / (total * 4), 3, 200));
      at::Tensor small = at::randn({n});
      at::Tensor big = at::randn({total});
      at::Tensor big_out = at::empty({total});

      struct Row {
        const char* name;
        double bus_factor;
        std::function<Work()> ours, backend;
      };
      std::vector<Row> rows = {
          {"all_gather", (w - 1.0) / w, [&] { return comm.all_gather(big_out, small); },
           [&] { return comm.native_all_gather(big_out, small); }},
          {"reduce_scatter", (w - 1.0) / w, [&] { return comm.reduce_scatter(small, big, ReduceOp::SUM); },
           [&] { return comm.native_reduce_scatter(small, big); }},
          {"all_reduce", 2.0 * (w - 1.0) / w, [&] { return comm.all_reduce(big, ReduceOp::SUM); }, {}},
      };
      for (const Row& row : rows) {
        double ours = time_op(comm, row.ours, iters);
        double algbw = size / ours / 1e9;
        if (!print) {
          if (row.backend) time_op(comm, row.backend, iters);
          continue;
        }
        std::printf("%-15s %12.0f %8d | %10.1f %8.3f %8.3f |", row.name, size, iters, ours * 1e6, algbw,
                    algbw * row.bus_factor);
        if (row.backend) {
          std::fflush(stdout);
          double theirs = time_op(comm, row.backend, iters);
          double their_algbw = size / theirs / 1e9;
          std::printf(" %10.1f %8.3f %8.3f | %8.2fx\n", theirs * 1e6, their_algbw, their_algbw * row.bus_factor,
                      theirs / ours);
        } else {
          std::printf(" %10s %8s %8s | %9s\n", "-", "-", "-", "-");
        }
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "comm_bench: " << e.what() << std::endl;
    return 1;
  }
}
