// The job's store, served by the launcher (private to the launch layer), as torchrun's agent serves it: every
// worker is a client (TORCHELASTIC_USE_AGENT_STORE=True), so any program torchrun can launch — PyTorch's
// init_process_group("env://") among them — runs unchanged, and no rank has to bind MASTER_PORT itself. The
// launcher binds the port once (loopback, or --master-addr's interface only) and serves a fresh store on it for
// each attempt of the worker group, so that a restarted group finds none of the failed one's keys. It holds the
// job's id under "shardtrain/job_id", which shardtrain's workers check before joining (a worker of another job
// that reached this port is refused).
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

namespace shardtrain::launch {

class AgentStore {
 public:
  // Serves on `listen_fd` (a socket bound to `host`:`port` and listening, which the caller keeps; a duplicate is
  // handed to the store). Throws std::runtime_error naming the address when it cannot.
  AgentStore(int listen_fd, const std::string& host, int port, const std::string& job_id);
  ~AgentStore();
  AgentStore(const AgentStore&) = delete;
  AgentStore& operator=(const AgentStore&) = delete;

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace shardtrain::launch
