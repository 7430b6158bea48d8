#include "shardtrain/distributed/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "distributed/backends.h"
#include "distributed/communicator_impl.h"
#include "distributed/connect_agreed.h"
#include "distributed/error_text.h"
#include "distributed/process_group_impl.h"

namespace shardtrain::dist {


namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::string this_hostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

// The address of this machine's interface that reaches `host` (the kernel's route choice: a UDP socket connected
// there sends nothing but has a local address). Gloo listens on it, so that ranks on other nodes reach this one
// through the same network as the rendezvous, whatever the host name resolves to. "" when it cannot be found.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) return "";
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

// Every rank's job id must be rank 0's: a worker of another job that reached this rendezvous (a wrong
// --master-addr or port) stops here, before it takes part in anything.
void check_same_job(c10d::Store& store, const DistEnv& env) {
  const std::string key = "shardtrain/job_id";
  if (env.rank == 0) {
    store.set(key, std::vector<uint8_t>(env.job_id.begin(), env.job_id.end()));
    return;
  }
  const std::vector<uint8_t> bytes = store.get(key);
  const std::string theirs(bytes.begin(), bytes.end());
  if (theirs != env.job_id) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " is of job '" + env.job_id +
                             "' (SHARDTRAIN_JOB_ID, --rdzv-id), but the rendezvous at " + env.master_addr + ":" +
                             std::to_string(env.master_port) + " is job '" + theirs +
                             "''s: another job's master answered (check --master-addr, --master-port and --rdzv-id)");
  }
}

std::string seconds_text(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  if (env.rank == 0 && env.master_listen_fd) options.masterListenFd = *env.master_listen_fd;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    const std::string role = env.rank == 0 ? "serving the rendezvous on port " + std::to_string(env.master_port) +
                                                 " and waiting for " + std::to_string(env.world_size - 1) +
                                                 " other rank(s)"
                                           : "connecting to the rendezvous";
    throw std::runtime_error("rendezvous failed on rank " + std::to_string(env.rank) + " of " +
                             std::to_string(env.world_size) + " (" + role + ") at MASTER_ADDR:MASTER_PORT = " +
                             env.master_addr + ":" + std::to_string(env.master_port) + " within " +
                             seconds_text(timeout) + ": " + error_text(e));
  }
}

// Gloo's connects, each agreed over the store (connect_agreed.h): a failure on some ranks makes all try again.
constexpr int kConnectAttempts = 3;

std::shared_ptr<Communicator::Impl> make_group(const ProcessGroup::Impl& pg,
                                               const c10::intrusive_ptr<c10d::Store>& store, std::vector<int> ranks,
                                               int group_rank, std::string name) {
  auto impl = std::make_shared<Communicator::Impl>();
  impl->rank = group_rank;
  impl->global_ranks = std::move(ranks);
  impl->name = std::move(name);
  const int size = static_cast<int>(impl->global_ranks.size());
  if (size == 1 && !pg.options.backend_at_world_one) return impl;  // SELF: nothing to connect
  impl->waits = pg.waits;
  if (pg.options.device == DeviceKind::CUDA) {
    impl->device_index = pg.options.device_index >= 0 ? pg.options.device_index : pg.env.local_rank;
  }
  if (pg.options.device == DeviceKind::CUDA && pg.options.cuda_backend == CudaBackend::NCCL) {
    impl->kind = CommBackend::NCCL;
    impl->backend = make_nccl_backend(store, group_rank, size, pg.options.timeout, impl->device_index);
  } else {
    impl->kind = CommBackend::GLOO;
    impl->backend = connect_agreed(store, group_rank, size, kConnectAttempts, pg.options.timeout, impl->name,
                                   [&](const c10::intrusive_ptr<c10d::Store>& attempt_store) {
                                     return make_gloo_backend(attempt_store, group_rank, size, pg.options.timeout,
                                                              pg.gloo_hostname, pg.options.gloo_threads);
                                   });
  }
  return impl;
}

}  // namespace

ProcessGroup ProcessGroup::init(const DistEnv& env, const ProcessGroupOptions& options) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw std::invalid_argument("ProcessGroup::init: rank " + std::to_string(env.rank) + " is not in [0, " +
                                std::to_string(env.world_size) + ")");
  }
  if (options.timeout.count() <= 0) {
    throw std::invalid_argument("ProcessGroup::init: timeout " + std::to_string(options.timeout.count()) +
                                " ms must be positive");
  }
  auto impl = std::make_shared<Impl>();
  impl->env = env;
  impl->options = options;
  std::vector<int> all(static_cast<size_t>(env.world_size));
  for (int r = 0; r < env.world_size; ++r) all[static_cast<size_t>(r)] = r;
  if (env.world_size > 1) {
    if (is_loopback(env.master_addr)) {
      impl->gloo_hostname = "127.0.0.1";
    } else {
      impl->gloo_hostname = local_address_towards(env.master_addr, env.master_port);
      if (impl->gloo_hostname.empty()) impl->gloo_hostname = this_hostname();
    }
    impl->store = connect_store(env, options.timeout);
    check_same_job(*impl->store, env);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("world", impl->store);
    impl->world = Communicator(make_group(*impl, prefixed, all, env.rank, "world"));
  } else if (options.backend_at_world_one) {
    impl->gloo_hostname = "127.0.0.1";
    impl->store = c10::make_intrusive<c10d::HashStore>();
    impl->world = Communicator(make_group(*impl, impl->store, all, 0, "world"));
  } else {
    impl->world = Communicator(make_group(*impl, nullptr, all, 0, "world"));
  }
  return ProcessGroup(std::move(impl));
}

const DistEnv& ProcessGroup::env() const { return impl_->env; }
int ProcessGroup::rank() const { return impl_->env.rank; }
int ProcessGroup::world_size() const { return impl_->env.world_size; }
DeviceKind ProcessGroup::device() const { return impl_->options.device; }
const Communicator& ProcessGroup::world() const { return *impl_->world; }

std::optional<Communicator> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  if (ranks.empty()) throw std::invalid_argument("new_group '" + name + "': empty rank list");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size()) {
      throw std::invalid_argument("new_group '" + name + "': rank " + std::to_string(ranks[i]) + " is not in [0, " +
                                  std::to_string(world_size()) + ")");
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      throw std::invalid_argument("new_group '" + name + "': ranks must be ascending without duplicates, got " +
                                  std::to_string(ranks[i - 1]) + " then " + std::to_string(ranks[i]));
    }
  }
  const int index = impl_->groups_created++;
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  if (it == ranks.end()) return std::nullopt;
  const int group_rank = static_cast<int>(it - ranks.begin());
  c10::intrusive_ptr<c10d::Store> store;
  if (impl_->store) store = c10::make_intrusive<c10d::PrefixStore>("group" + std::to_string(index), impl_->store);
  return Communicator(make_group(*impl_, store, ranks, group_rank, name));
}

at::Device rank_device(bool cuda, const DistEnv& env, const std::string& what) {
  if (!cuda) return at::Device(at::kCPU);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) throw std::invalid_argument(what + " but this machine has no visible CUDA device");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % gpus));
}

ProcessGroupOptions group_options_for(const at::Device& device, const DistEnv& env) {
  ProcessGroupOptions o;
  if (!device.is_cuda()) return o;
  o.device = DeviceKind::CUDA;
  o.device_index = device.index();
  const bool shared = env.local_world_size > static_cast<int>(torch::cuda::device_count());
  o.cuda_backend = shared ? CudaBackend::GLOO : CudaBackend::NCCL;
  return o;
}

}  // namespace shardtrain::dist
