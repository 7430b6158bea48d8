#include "train/nonfinite_policy.h"

namespace shardtrain::train {

NonFinitePolicy::NonFinitePolicy(const config::TrainConfig& train)
    : mode_(train.on_nonfinite),
      max_skipped_(train.max_skipped_steps),
      window_steps_(train.skip_window),
      max_rollbacks_(train.max_rollbacks) {}

NonFinitePolicy::Action NonFinitePolicy::on_nonfinite(int64_t step, const std::string& what) {
  events_.push_back("step " + std::to_string(step) + ": " + what);
  if (mode_ == config::NonFinite::STOP) return Action::STOP;
  const Action beyond = rollbacks_ < max_rollbacks_ ? Action::ROLLBACK : Action::STOP;
  if (mode_ == config::NonFinite::ROLLBACK) return beyond;
  window_.push_back(step);
  while (!window_.empty() && window_.front() <= step - window_steps_) window_.pop_front();
  return skipped_in_window() > max_skipped_ ? beyond : Action::SKIP;
}

NonFinitePolicy::Action NonFinitePolicy::on_nonfinite_weights(int64_t step, const std::string& what) {
  events_.push_back("after step " + std::to_string(step) + ": " + what);
  if (mode_ == config::NonFinite::STOP || rollbacks_ >= max_rollbacks_) return Action::STOP;
  return Action::ROLLBACK;
}

void NonFinitePolicy::rolled_back(int64_t from, int64_t to) {
  ++rollbacks_;
  window_.clear();
  events_.push_back("rolled back from step " + std::to_string(from) + " to step " + std::to_string(to));
}

std::string NonFinitePolicy::history() const {
  constexpr size_t kShown = 24;  // the latest; a long skip window can hold many more
  std::string out;
  const size_t first = events_.size() > kShown ? events_.size() - kShown : 0;
  if (first > 0) out = "(" + std::to_string(first) + " earlier)";
  for (size_t i = first; i < events_.size(); ++i) out += (out.empty() ? "" : "; ") + events_[i];
  return out;
}

}  // namespace shardtrain::train
