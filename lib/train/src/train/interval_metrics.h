// What the loop measures between two log lines (private to the train layer): each step's numbers on this rank
// (StepTotals), their sums over the interval (IntervalSums), and the reduction over the ranks into the
// IntervalMetrics the log prints.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"
#include "train/metrics_log.h"

namespace shardtrain::train {

// One optimizer step on this rank.
struct StepTotals {
  double loss = 0;                      // mean over the micro-batches
  std::map<std::string, double> parts;  // each loss the micro-batches reported, mean over them
  double grad_norm = 0;                 // before clipping
  bool stepped = true;                  // false: the update was skipped (below, or float16 gradients overflowed)
  // What was not finite when the step was skipped for it, the same on every rank ("non-finite loss on rank 1",
  // "grad_norm inf"); empty for a finite step.
  std::string nonfinite;
  int64_t texts = 0, images = 0;        // items as the FLAVA post counts them
  double flops = 0;                     // model FLOPs (ModelRecipe::training_flops)
  double seconds = 0;                   // wall time of the step
};

// Sums over one logging interval on this rank.
struct IntervalSums {
  int64_t steps = 0;
  double loss = 0, grad_norm = 0;
  std::map<std::string, std::pair<double, int64_t>> parts;  // sum, steps that had it
  int64_t texts = 0, images = 0;  // steps after warm-up only
  double flops = 0, seconds = 0;  // steps after warm-up only

  // `timed`: the step counts for throughput (it is past log.warmup_steps).
  void add(const StepTotals& step, bool timed);
};

// Means over ranks (loss, each part over the ranks that had it), sums (items, FLOPs), the slowest rank's seconds,
// and every rank's peak memory. Collective over `world`; tensors travel on `device` (NCCL reduces device tensors).
IntervalMetrics reduce_interval(const IntervalSums& sums, const std::vector<std::string>& loss_names,
                                double peak_memory_gib, double peak_tflops, const dist::Communicator& world,
                                const c10::Device& device);

// Peak dense FLOP/s of one rank in TFLOP/s: float32 matmuls on CPU, bf16 on CUDA, the best of a few runs.
double measure_peak_tflops(const c10::Device& device);

}  // namespace shardtrain::train
