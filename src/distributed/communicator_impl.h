// The state behind a Communicator handle (private to the dist layer).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

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
};

}  // namespace shardtrain::dist
