// What the C++ sides of the benchmarks share (header-only, for the bench binaries): the timed training loop and its
// RESULT line, measured as the Python sides measure (bench/bench_common.py): median step of the slowest rank, the
// peak bytes (our counting allocator) of each phase of a step — forward with the loss, backward, optimizer step
// with zero_grad — on the largest rank, and each step's loss averaged over the ranks.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::bench {

struct StepLoop {
  std::vector<double> step_ms;                    // the timed steps, in order
  std::vector<double> losses;                     // every step's, warm-up included
  std::vector<double> phase_peak{0.0, 0.0, 0.0};  // bytes: the largest peak of each phase over the timed steps
  std::vector<std::vector<double>> phase_ms{{}, {}, {}};  // each phase's milliseconds in the timed steps
};

// warmup + steps steps; loss_of_step(s) is step s's forward and loss; after_backward (optional) runs between
// backward and the optimizer, in the backward phase (tensor parallelism's gradient reduction). Collective over
// `world` (the loss average).
inline StepLoop run_steps(const dist::Communicator& world, int64_t steps, int64_t warmup,
                          const std::function<at::Tensor(int64_t)>& loss_of_step, torch::optim::Optimizer& optimizer,
                          const std::function<void()>& after_backward = {}) {
  StepLoop out;
  bool timed = false;
  auto phase_start = std::chrono::steady_clock::now();
  auto end_phase = [&](size_t phase) {
    const auto now = std::chrono::steady_clock::now();
    const auto peak = static_cast<double>(memory::cpu_memory_stats().peak_bytes);
    if (timed) {
      out.phase_peak[phase] = std::max(out.phase_peak[phase], peak);
      out.phase_ms[phase].push_back(std::chrono::duration<double, std::milli>(now - phase_start).count());
    }
    memory::reset_cpu_peak();
    phase_start = now;
  };
  for (int64_t s = 0; s < steps + warmup; ++s) {
    timed = s >= warmup;
    const auto t0 = std::chrono::steady_clock::now();
    phase_start = t0;
    memory::reset_cpu_peak();
    at::Tensor loss = loss_of_step(s);
    end_phase(0);
    loss.backward();
    if (after_backward) after_backward();
    end_phase(1);
    optimizer.step();
    optimizer.zero_grad();
    end_phase(2);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    at::Tensor global = loss.detach().clone();
    world.all_reduce(global, dist::ReduceOp::MEAN).wait();
    if (timed) out.step_ms.push_back(ms);
    out.losses.push_back(global.item<double>());
  }
  return out;
}

// The value after option argv[i] (i moves past it); std::invalid_argument naming the option when there is none.
inline std::string option_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

// The median of `ms` (the upper one of an even count, as Python's sorted(ms)[len // 2]).
inline double median_ms(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Rank 0 prints RESULT {<fields>, "step_ms", "phase_ms", "peak_bytes", "phase_peak_bytes", "losses"} with the
// losses from step `first_loss` on; `fields` is JSON members without braces ("\"impl\": \"shardtrain\", ...").
// Times are each rank's median, the slowest rank's printed. Collective.
inline void print_result(const dist::Communicator& world, const std::string& fields, const StepLoop& r,
                         size_t first_loss = 0) {
  // [step ms, forward ms, backward ms, optimizer ms, forward bytes, backward bytes, optimizer bytes]
  at::Tensor summary = at::tensor({median_ms(r.step_ms), median_ms(r.phase_ms[0]), median_ms(r.phase_ms[1]),
                                   median_ms(r.phase_ms[2]), r.phase_peak[0], r.phase_peak[1], r.phase_peak[2]},
                                  at::kDouble);
  world.all_reduce(summary, dist::ReduceOp::MAX).wait();
  if (world.rank() != 0) return;
  auto v = [&](int64_t i) { return summary[i].item<double>(); };
  std::ostringstream out;
  out.precision(10);
  out << "RESULT {" << fields << ", \"step_ms\": " << v(0) << ", \"phase_ms\": [" << v(1) << ", " << v(2)
      << ", " << v(3) << "], \"peak_bytes\": " << summary.narrow(0, 4, 3).max().item<double>()
      << ", \"phase_peak_bytes\": [" << v(4) << ", " << v(5) << ", " << v(6) << "], \"losses\": [";
  for (size_t i = first_loss; i < r.losses.size(); ++i) out << (i > first_loss ? ", " : "") << r.losses[i];
  out << "]}";
  std::cout << out.str() << std::endl;
}

}  // namespace shardtrain::bench
