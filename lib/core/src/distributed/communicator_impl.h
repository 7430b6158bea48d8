// The state behind a Communicator handle (private to the dist layer).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::dist {

struct WaitBoard;  // work_state.h

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Backend> backend;  // null for CommBackend::SELF
  CommBackend kind = CommBackend::SELF;
  int rank = 0;
  std::vector<int> global_ranks{0};
  std::string name = "world";
  int device_index = -1;  // CUDA device of an NCCL group (for barrier); -1 on CPU
  std::shared_ptr<WaitBoard> waits;  // the process group's (work_state.h); null for SELF
  // Point-to-point messages of one operation carry a tag of their own, the same on every rank (all issue the
  // group's operations in one order): an operation's late receives never match an earlier or later one's sends.
  std::atomic<int> tags{0};
  int next_tag() { return tags.fetch_add(1) & 0x3fffffff; }
};

}  // namespace shardtrain::dist
