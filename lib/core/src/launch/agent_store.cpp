#include "launch/agent_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace shardtrain::launch {

AgentStore::AgentStore(int listen_fd, const std::string& host, int port, const std::string& job_id) {
  // The store closes the descriptor it serves on when it stops; the launcher's stays bound for the next attempt.
  const int fd = ::fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("cannot serve the job's store: dup: " + std::string(std::strerror(errno)));
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.masterListenFd = fd;
  const std::string where = "cannot serve the job's store at " + host + ":" + std::to_string(port) + ": ";
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(host, options);  // also its own client, on the address served
    store_->set("shardtrain/job_id", std::vector<uint8_t>(job_id.begin(), job_id.end()));
  } catch (const c10::Error& e) {
    throw std::runtime_error(where + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(where + e.what());
  }
}

AgentStore::~AgentStore() = default;

}  // namespace shardtrain::launch
