// What a Work holds while its operation is in flight (private to the dist layer).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::dist {

// What the process is blocked in: the operation a wait() is waiting for ("" when none), read by the heartbeat
// thread to say which collective the others wait in while a rank hangs. One per ProcessGroup.
struct WaitBoard {
  std::mutex mutex;
  std::string waiting;
};

struct Work::State {
  // The backend's handles, waited for in order: one, or one per part of an operation made of several (Gloo's
  // all-gather: a broadcast from each rank). Empty when nothing is in flight.
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::function<void()> finish;         // local step once the transfer is done (fallback sum, mean's divide)
  std::vector<at::Tensor> keep_alive;   // inputs, outputs and scratch buffers the transfer reads or writes
  std::string what;                     // "reduce_scatter(SUM) on world (rank 1 of 4)" for error messages
  bool done = false;
  std::shared_ptr<WaitBoard> waits;     // the group's board; null for a world of one
  // Gloo: the worker thread that ran the operation drops its reference to it (and so to the tensors above) just
  // after completing it, concurrently with wait() returning. wait() lets that happen first, so an operation's
  // buffers are freed when wait() returns — a caller allocating the next buffer never holds both.
  bool settle_backend_references = false;
  // finish moves data itself (receives it posts and sends it waits for): the operation is not complete before it
  // ran, and its failures are the operation's.
  bool finish_transfers = false;
};

}  // namespace shardtrain::dist
