// train.on_nonfinite's decisions (private to the train layer): what the run does after a step whose loss or
// gradient norm was not finite, from the steps skipped so far and the rollbacks made, and the history it stops
// with. The loop acts on them (trainer.cpp); every rank decides alike from the same agreed steps.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "shardtrain/config/config.h"

namespace shardtrain::train {

class NonFinitePolicy {
 public:
  enum class Action { SKIP, ROLLBACK, STOP };

  explicit NonFinitePolicy(const config::TrainConfig& train);

  // Step `step` (1-based, as the log counts) was not finite (`what`: "non-finite loss on rank 1"); its update was
  // not applied. SKIP: go on; ROLLBACK: load the newest verified checkpoint (then rolled_back(), or stop when there
  // is none); STOP: end the run (history() says why).
  Action on_nonfinite(int64_t step, const std::string& what);
  // After step `step` the weights or optimizer state themselves hold NaN or Inf (`what`): skipping steps cannot
  // mend them, so ROLLBACK while rollbacks are left (STOP under on_nonfinite: stop, or beyond max_rollbacks).
  Action on_nonfinite_weights(int64_t step, const std::string& what);

  // The run went back from step `from` to the checkpoint of step `to`: the skip window starts afresh.
  void rolled_back(int64_t from, int64_t to);

  // Steps skipped within the window ending at the last one recorded.
  int64_t skipped_in_window() const { return static_cast<int64_t>(window_.size()); }
  int64_t rollbacks() const { return rollbacks_; }

  // Why the run stops: each skipped step and rollback in order ("step 2: non-finite loss on rank 0; ...; rolled
  // back from step 7 to step 1; ..."), the latest 24.
  std::string history() const;

 private:
  config::NonFinite mode_;
  int64_t max_skipped_, window_steps_, max_rollbacks_;
  std::deque<int64_t> window_;         // the skipped steps within the last window_steps_, oldest first
  int64_t rollbacks_ = 0;
  std::vector<std::string> events_;    // for history()
};

}  // namespace shardtrain::train
