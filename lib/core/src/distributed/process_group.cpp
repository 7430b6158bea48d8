#include "shardtrain/distributed/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "cuda/entry_points.h"
#include "distributed/backends.h"
#include "distributed/communicator_impl.h"
#include "distributed/connect_agreed.h"
#include "distributed/error_text.h"
#include "distributed/process_group_impl.h"
#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/util/seconds_text.h"

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

// The key under which the job's id waits in its store: set by `shardtrain launch` when it serves the store
// (launch/agent_store.h), else by rank 0.
constexpr const char* kJobIdKey = "shardtrain/job_id";

// Every rank's job id must be the store's: a worker of another job that reached this rendezvous (a wrong
// --master-addr or port) stops here, before it takes part in anything. A store that torchrun serves names no job.
void check_same_job(c10d::Store& store, const DistEnv& env) {
  if (!env.agent_store && env.rank == 0) {
    store.set(kJobIdKey, std::vector<uint8_t>(env.job_id.begin(), env.job_id.end()));
    return;
  }
  if (env.agent_store && !store.check({kJobIdKey})) return;
  const std::vector<uint8_t> bytes = store.get(kJobIdKey);
  const std::string theirs(bytes.begin(), bytes.end());
  if (theirs != env.job_id) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " is of job '" + env.job_id +
                             "' (SHARDTRAIN_JOB_ID, --rdzv-id), but the rendezvous at " + env.master_addr + ":" +
                             std::to_string(env.master_port) + " is job '" + theirs +
                             "''s: another job's master answered (check --master-addr, --master-port and --rdzv-id)");
  }
}

using util::seconds_text;

using Clock = std::chrono::steady_clock;

std::string waited_text(Clock::time_point since, std::chrono::milliseconds timeout) {
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - since);
  return std::to_string(waited.count()) + " s of " + seconds_text(timeout);
}

std::string where(const DistEnv& env) { return env.master_addr + ":" + std::to_string(env.master_port); }

// The job's store: a client of the launcher's (agent_store), or rank 0 serving it. A client whose store does not
// answer yet (node 0 not started) tries again every wait_note_interval, saying so, until `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, const ProcessGroupOptions& o) {
  const bool serve = !env.agent_store && env.rank == 0;
  const Clock::time_point start = Clock::now();
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(o.timeout - (Clock::now() - start));
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = serve;
    options.numWorkers = static_cast<std::size_t>(env.world_size);
    options.waitWorkers = false;  // the arrival below waits, and says for whom
    const std::chrono::milliseconds note_every = wait_note_interval(o.timeout);
    const bool retry = !serve && o.waiting_note && left > note_every;
    options.timeout = retry ? note_every : std::max(left, std::chrono::milliseconds(1));
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
      store->setTimeout(o.timeout);  // every later wait on it (a peer's key) gets the whole timeout
      return store;
    } catch (const std::exception& e) {
      if (retry) {
        o.waiting_note("rank " + std::to_string(env.rank) + ": the rendezvous at " + where(env) +
                       " does not answer yet (" + waited_text(start, o.timeout) + ")");
        continue;
      }
      const std::string role = serve ? "serving the rendezvous on port " + std::to_string(env.master_port)
                                     : "connecting to the rendezvous";
      throw std::runtime_error("rendezvous failed on rank " + std::to_string(env.rank) + " of " +
                               std::to_string(env.world_size) + " (" + role + ") at MASTER_ADDR:MASTER_PORT = " +
                               where(env) + " within " + seconds_text(o.timeout) + ": " + error_text(e));
    }
  }
}

// Every rank says it arrived ("arrived/R": its host and pid) and waits for the others, saying every
// wait_note_interval which ranks it waits for; std::runtime_error naming them after `timeout`.
void wait_for_every_rank(c10d::Store& store, const DistEnv& env, const ProcessGroupOptions& o) {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = std::string(host) + " pid " + std::to_string(::getpid());
  store.set("arrived/" + std::to_string(env.rank), std::vector<uint8_t>(me.begin(), me.end()));
  store.add("arrived", 1);
  const Clock::time_point start = Clock::now();
  const std::chrono::milliseconds note_every = wait_note_interval(o.timeout);
  Clock::time_point next_note = start + note_every;
  auto missing = [&] {
    std::vector<int> out;
    for (int r = 0; r < env.world_size; ++r) {
      if (!store.check({"arrived/" + std::to_string(r)})) out.push_back(r);
    }
    std::string text;
    for (size_t i = 0; i < out.size() && i < 16; ++i) text += (i ? ", " : "") + std::to_string(out[i]);
    if (out.size() > 16) text += " and " + std::to_string(out.size() - 16) + " more";
    return (out.size() == 1 ? "rank " : "ranks ") + text;
  };
  while (store.add("arrived", 0) < env.world_size) {
    const Clock::time_point now = Clock::now();
    if (now - start >= o.timeout) {
      throw std::runtime_error("rendezvous failed on rank " + std::to_string(env.rank) + " of " +
                               std::to_string(env.world_size) + " at " + where(env) + ": " + missing() +
                               " did not arrive within " + seconds_text(o.timeout));
    }
    if (o.waiting_note && now >= next_note) {
      o.waiting_note("rank " + std::to_string(env.rank) + ": waiting at the rendezvous " + where(env) + " for " +
                     missing() + " (" + waited_text(start, o.timeout) + ")");
      next_note = now + note_every;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Gloo's connects, each agreed over the store (connect_agreed.h): a failure on some ranks makes all try again.
constexpr int kConnectAttempts = 3;

// `host`: Gloo over host tensors whatever the ranks compute on (ProcessGroup::new_host_group).
std::shared_ptr<Communicator::Impl> make_group(const ProcessGroup::Impl& pg,
                                               const c10::intrusive_ptr<c10d::Store>& store, std::vector<int> ranks,
                                               int group_rank, std::string name, bool host = false) {
  auto impl = std::make_shared<Communicator::Impl>();
  impl->rank = group_rank;
  impl->global_ranks = std::move(ranks);
  impl->name = std::move(name);
  const int size = static_cast<int>(impl->global_ranks.size());
  if (size == 1 && !pg.options.backend_at_world_one) return impl;  // SELF: nothing to connect
  impl->waits = pg.waits;
  const bool cuda = pg.options.device == parallel::Device::CUDA && !host;
  if (cuda) impl->device_index = pg.options.device_index >= 0 ? pg.options.device_index : pg.env.local_rank;
  if (cuda && pg.options.cuda_backend == CudaBackend::NCCL) {
    impl->kind = CommBackend::NCCL;
    impl->backend =
        cuda::entry_points().make_nccl_backend(store, group_rank, size, pg.options.timeout, impl->device_index);
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

std::chrono::milliseconds wait_note_interval(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(std::chrono::seconds(30), timeout / 4);
}

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
    impl->store = connect_store(env, options);
    check_same_job(*impl->store, env);
    // A store the launcher serves may outlive an attempt (torchrun's does across restarts): each attempt's keys
    // are its own.
    if (env.agent_store) {
      impl->store = c10::make_intrusive<c10d::PrefixStore>("attempt" + std::to_string(env.restart_count),
                                                           impl->store);
    }
    wait_for_every_rank(*impl->store, env, options);
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
parallel::Device ProcessGroup::device() const { return impl_->options.device; }
const Communicator& ProcessGroup::world() const { return *impl_->world; }

std::optional<Communicator> ProcessGroup::make_subgroup(const std::vector<int>& ranks, const std::string& name,
                                                       bool host) {
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
  return Communicator(make_group(*impl_, store, ranks, group_rank, name, host));
}

std::optional<Communicator> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  return make_subgroup(ranks, name, /*host=*/false);
}

std::optional<Communicator> ProcessGroup::new_host_group(const std::vector<int>& ranks, const std::string& name) {
  return make_subgroup(ranks, name, /*host=*/true);
}

at::Device rank_device(bool cuda, const DistEnv& env, const std::string& what) {
  if (!cuda) return at::Device(at::kCPU);
  const int gpus = cuda::load_cuda();
  if (gpus == 0) throw std::invalid_argument(what + " but this machine has no visible CUDA device");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % gpus));
}

ProcessGroupOptions group_options_for(const at::Device& device, const DistEnv& env) {
  ProcessGroupOptions o;
  if (!device.is_cuda()) return o;
  o.device = parallel::Device::CUDA;
  o.device_index = device.index();
  const bool shared = env.local_world_size > cuda::load_cuda();
  o.cuda_backend = shared ? CudaBackend::GLOO : CudaBackend::NCCL;
  return o;
}

}  // namespace shardtrain::dist
