// What a Work holds while its operation is in flight (private to the dist layer).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <string>
#include <vector>

#include "shardtrain/dist/communicator.h"

namespace shardtrain::dist {

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;  // the backend's handle; null when nothing is in flight
  std::function<void()> finish;         // local step once the transfer is done (fallback sum, mean's divide)
  std::vector<at::Tensor> keep_alive;   // inputs, outputs and scratch buffers the transfer reads or writes
  std::string what;                     // "reduce_scatter(SUM) on world (rank 1 of 4)" for error messages
  bool done = false;
};

}  // namespace shardtrain::dist
