// What a Work holds while its operation is in flight (private to the dist layer).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::dist {

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;  // the backend's handle; null when nothing is in flight
  std::function<void()> finish;         // local step once the transfer is done (fallback sum, mean's divide)
  std::vector<at::Tensor> keep_alive;   // inputs, outputs and scratch buffers the transfer reads or writes
  std::string what;                     // "reduce_scatter(SUM) on world (rank 1 of 4)" for error messages
  bool done = false;
  // Gloo: the worker thread that ran the operation drops its reference to it (and so to the tensors above) just
  // after completing it, concurrently with wait() returning. wait() lets that happen first, so an operation's
  // buffers are freed when wait() returns — a caller allocating the next buffer never holds both.
  bool settle_backend_references = false;
};

}  // namespace shardtrain::dist
