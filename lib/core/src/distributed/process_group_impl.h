// What a ProcessGroup holds (private to the dist layer): the store, the options, the world communicator.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <optional>
#include <string>

#include "distributed/work_state.h"
#include "shardtrain/distributed/process_group.h"

namespace shardtrain::dist {

struct ProcessGroup::Impl {
  DistEnv env;
  ProcessGroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;  // null at world size 1
  std::string gloo_hostname;              // where Gloo listens: loopback on one node, else the interface that
                                          // reaches MASTER_ADDR
  std::optional<Communicator> world;
  std::shared_ptr<WaitBoard> waits = std::make_shared<WaitBoard>();  // what this process is blocked in
  int groups_created = 0;  // sub-group counter: every rank counts the same, so it names the store prefix

  // Destroy communicators (their backends hold the store) before the store.
  ~Impl() { world.reset(); }
};

}  // namespace shardtrain::dist
