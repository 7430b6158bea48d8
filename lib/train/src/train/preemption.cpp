#include "train/preemption.h"

#include <ATen/ops/full.h>
#include <atomic>

namespace shardtrain::train {
namespace {

// [Note: preemption flag] A signal handler can only set a lock-free atomic, and must find it without arguments:
// this one process-wide variable, owned by the one PreemptionWatch alive at a time.
std::atomic<int> pending_signal{0};

constexpr int kWatched[] = {SIGTERM, SIGINT};

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!pending_signal.compare_exchange_strong(expected, sig) && expected == sig) {
    ::signal(sig, SIG_DFL);  // asked twice: stop now
    ::raise(sig);
  }
}

}  // namespace

PreemptionWatch::PreemptionWatch() {
  pending_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight go on
  for (int i = 0; i < 2; ++i) ::sigaction(kWatched[i], &action, &saved_[i]);
}

PreemptionWatch::~PreemptionWatch() {
  for (int i = 0; i < 2; ++i) ::sigaction(kWatched[i], &saved_[i], nullptr);
}

int PreemptionWatch::agreed_signal(const dist::Communicator& world) const {
  const int mine = pending_signal.load();
  if (world.size() == 1) return mine;
  // float32: every backend reduces it; signal numbers are small integers, exact in float.
  at::Tensor seen = at::full({1}, static_cast<float>(mine), at::TensorOptions().device(world.device()));
  world.all_reduce(seen, dist::ReduceOp::MAX).wait();
  return static_cast<int>(seen.item<float>());
}

}  // namespace shardtrain::train
