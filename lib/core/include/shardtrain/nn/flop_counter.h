// FLOPs actually executed, counted op by op (what torch.utils.flop_counter.FlopCounterMode counts): while a
// FlopCounter lives, every matrix product, convolution and fused attention kernel run on this thread — forward,
// and the backward autograd runs on it (CPU) — adds its multiply-adds times two:
//   mm / addmm (m, k) x (k, n)            2 m k n            mv / addmv (m, n) x (n)     2 m n
//   bmm / baddbmm (b, m, k) x (b, k, n)   2 b m k n
//   convolution                           2 x output elements x weight elements per output channel (/ groups)
//   convolution_backward                  the same for each of the input and weight gradients it computes
//   fused attention, q (B, H, S, D), k (B, H', S', D), v (B, H', S', D')
//                                         2 B H S S' (D + D') forward, twice that backward
// Composite ops (linear, matmul, einsum, attention's math path) are counted through the products they run, so
// nothing is counted twice; elementwise ops, norms and softmax count nothing (the convention of MFU).
// It checks the models' training_flops formulas (tests/unit/flop_count_test.cpp). Not thread-safe: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace shardtrain::nn {

class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  double total() const { return total_; }
  // FLOPs by op name ("aten::mm", ...).
  const std::map<std::string, double>& by_op() const { return by_op_; }

  void add(const char* op, double flops);  // for the counting callback

 private:
  double total_ = 0;
  std::map<std::string, double> by_op_;
  uint64_t handle_ = 0;        // the RecordFunction callback's
  FlopCounter* outer_ = nullptr;  // the counter this one is nested in: both count
};

}  // namespace shardtrain::nn
