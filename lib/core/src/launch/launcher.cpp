#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/agent_store.h"
#include "launch/elastic_rendezvous.h"
#include "launch/output_relay.h"
#include "launch/worker.h"
#include "shardtrain/launch/error_file.h"
#include "shardtrain/launch/launch.h"
#include "shardtrain/util/random_id.h"

extern char** environ;

namespace shardtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;


void say(const std::string& message) { write_all(STDERR_FILENO, "shardtrain launch: " + message + "\n"); }

// [Note: signal self-pipe] A signal handler may only do async-signal-safe work, so it writes the signal number into
// a pipe that the supervision loop polls beside the workers' output. The write end must be reachable from the
// handler, hence this one process-wide variable; SignalPipe owns it and restores the old handlers on destruction.
std::atomic<int> signal_pipe_write_fd{-1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  int fd = signal_pipe_write_fd.load();
  if (fd >= 0) {
    unsigned char byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe: " + std::string(strerror(errno)));
    signal_pipe_write_fd.store(fds_[1]);
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_NOCLDSTOP;
    for (int sig : kHandled) ::sigaction(sig, &action, &saved_[sig]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &saved_[SIGPIPE]);  // a closed stdout must not kill the supervisor
  }
  ~SignalPipe() {
    for (int sig : kHandled) ::sigaction(sig, &saved_[sig], nullptr);
    ::sigaction(SIGPIPE, &saved_[SIGPIPE], nullptr);
    signal_pipe_write_fd.store(-1);
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int read_fd() const { return fds_[0]; }
  // Drains the pipe; returns the first terminating signal seen (SIGINT/SIGTERM/SIGHUP), 0 if only SIGCHLD.
  int drain() {
    int terminating = 0;
    unsigned char byte;
    while (::read(fds_[0], &byte, 1) == 1) {
      if (byte != SIGCHLD && terminating == 0) terminating = byte;
    }
    return terminating;
  }

 private:
  static constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  int fds_[2] = {-1, -1};
  struct sigaction saved_[NSIG] {};
};

// Splits a worker's output into lines and writes each with the rank prefix in one write() call, so lines of
// different ranks never interleave mid-line.
// A bound, listening socket for the rendezvous. See [Note: launcher-owned rendezvous socket].
class ListenSocket {
 public:
  // `port_option`: where the port came from, for the error ("--master-port", "launch.main_process_port").
  ListenSocket(const std::string& host, int port, const std::string& port_option) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || found == nullptr) {
      throw std::runtime_error("cannot resolve --master-addr '" + host + "': " + gai_strerror(rc));
    }
    sockaddr_in address = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
    ::freeaddrinfo(found);
    address.sin_port = htons(static_cast<uint16_t>(port));
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket: " + std::string(strerror(errno)));
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      int err = errno;
      ::close(fd_);
      throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + " for the rendezvous: " +
                               strerror(err) + (port != 0 ? " (choose another " + port_option + ")" : ""));
    }
    ::listen(fd_, 1024);
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~ListenSocket() { ::close(fd_); }
  ListenSocket(const ListenSocket&) = delete;
  ListenSocket& operator=(const ListenSocket&) = delete;
  int fd() const { return fd_; }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Where rank `rank` records its error (TORCHELASTIC_ERROR_FILE).
std::string error_file_of(const std::string& dir, int rank) {
  return dir + "/error-rank" + std::to_string(rank) + ".json";
}

// The variables the launcher sets for every worker (torchrun's), which replace any the environment already holds.
constexpr const char* kLauncherVariables[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                              "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                                              "MASTER_PORT"};

// batch_limit: kAutoBatchLimitEnv for the workers (0: the environment's own, if any).
std::vector<std::string> worker_environment(const LaunchOptions& o, int local_rank, const std::string& master_addr,
                                            int master_port, int restart, const std::string& job_id,
                                            const std::string& error_dir, int64_t batch_limit) {
  const int world = o.nnodes * o.nproc_per_node;
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  vars["RANK"] = std::to_string(rank);
  vars["WORLD_SIZE"] = std::to_string(world);
  vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  vars["GROUP_RANK"] = std::to_string(o.node_rank);
  vars["GROUP_WORLD_SIZE"] = std::to_string(o.nnodes);
  vars["ROLE_NAME"] = "default";
  vars["ROLE_RANK"] = std::to_string(rank);
  vars["ROLE_WORLD_SIZE"] = std::to_string(world);
  vars["MASTER_ADDR"] = master_addr;
  vars["MASTER_PORT"] = std::to_string(master_port);
  vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart);
  vars["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  vars["TORCHELASTIC_RUN_ID"] = job_id;
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // [Note: the launcher's store] (agent_store.h)
  vars["SHARDTRAIN_JOB_ID"] = job_id;
  vars["TORCHELASTIC_ERROR_FILE"] = error_file_of(error_dir, rank);
  if (batch_limit > 0) vars[kAutoBatchLimitEnv] = std::to_string(batch_limit);
  // An elastic job's world size may change between rounds (a trainer then keeps its global batch).
  if (o.min_nodes > 0) {
    vars["SHARDTRAIN_ELASTIC"] = "1";
  } else {
    vars.erase("SHARDTRAIN_ELASTIC");
  }
  if (!o.gpu_ids.empty() && o.gpu_ids != "all") vars["CUDA_VISIBLE_DEVICES"] = o.gpu_ids;
  if (::isatty(STDERR_FILENO)) {
    vars[kProgressEnv] = "relay";  // [Note: progress through the launcher]
  } else {
    vars.erase(kProgressEnv);  // a launcher around this one drew it; this one cannot
  }
  // Several workers on one node each running a full-width thread pool oversubscribe the cores (torchrun does the
  // same); a value the user set is kept.
  if (o.nproc_per_node > 1 && vars.count("OMP_NUM_THREADS") == 0) vars["OMP_NUM_THREADS"] = "1";
  std::vector<std::string> env;
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

// Where the workers leave their errors: a fresh directory under $TMPDIR (or /tmp), removed with what it holds.
struct ErrorDirectory {
  std::string path;
  ErrorDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/shardtrain-launch-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot make a directory for the workers' error files (" + pattern +
                               "): " + std::strerror(errno));
    }
    path = pattern;
  }
  ~ErrorDirectory() {
    if (DIR* dir = ::opendir(path.c_str())) {
      while (dirent* entry = ::readdir(dir)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") ::unlink((path + "/" + name).c_str());
      }
      ::closedir(dir);
    }
    ::rmdir(path.c_str());
  }
  ErrorDirectory(const ErrorDirectory&) = delete;
  ErrorDirectory& operator=(const ErrorDirectory&) = delete;
};

// MEMBERSHIP_CHANGED: an elastic job's round ended elsewhere (another node's workers failed, a node joined).
enum class GroupEnd { SUCCESS, WORKER_FAILED, OUT_OF_MEMORY, PREEMPTED, LAUNCHER_SIGNALED, MEMBERSHIP_CHANGED };

std::string seconds(std::chrono::milliseconds d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", static_cast<double>(d.count()) / 1000.0);
  return text;
}

// One id for the job across its restarts (a restarted trainer resumes only this job's checkpoints) and its nodes
// (a worker of another job that reaches this job's rendezvous is refused): --rdzv-id, else SHARDTRAIN_JOB_ID or
// Slurm's job id from the environment, else on one node a random one. Several nodes must be told theirs.
std::string job_id_of(const LaunchOptions& o) {
  if (!o.rdzv_id.empty()) return o.rdzv_id;
  for (const char* name : {"SHARDTRAIN_JOB_ID", "SLURM_JOB_ID"}) {
    const char* value = std::getenv(name);
    if (value && *value) return value;
  }
  if (o.nnodes > 1) {
    throw std::invalid_argument("--nnodes " + (o.min_nodes > 0 ? std::to_string(o.min_nodes) + ":" : "") +
                                std::to_string(o.nnodes) + " needs --rdzv-id ID, the same on every " +
                                "node (under Slurm its job id is used): the workers of one job check it at the " +
                                "rendezvous, so that another job's cannot join");
  }
  return util::random_id();
}

struct GroupResult {
  GroupEnd end = GroupEnd::SUCCESS;
  int exit_code = 0;
  int64_t retry_batch = 0;  // OUT_OF_MEMORY: the smallest batch a worker asked to be restarted with
  std::string why;          // WORKER_FAILED: which rank and how; MEMBERSHIP_CHANGED: what ended the round
};

// The workers of one attempt, their output relays and the supervision loop.
class WorkerGroup {
 public:
  WorkerGroup(const LaunchOptions& o, const std::string& master_addr, int master_port, int restart,
              const std::string& job_id, const std::string& error_dir, int64_t batch_limit, SignalPipe& signals,
              StatusLine& status)
      : options_(o), signals_(signals), error_dir_(error_dir), status_(status) {
    for (int local = 0; local < o.nproc_per_node; ++local) {
      WorkerSpec spec;
      spec.rank = o.node_rank * o.nproc_per_node + local;
      spec.command = o.command;
      ::unlink(error_file_of(error_dir, spec.rank).c_str());  // an earlier attempt's
      spec.env = worker_environment(o, local, master_addr, master_port, restart, job_id, error_dir, batch_limit);
      workers_.push_back(std::make_unique<Worker>(spec));
      out_relays_.emplace_back(spec.rank, STDOUT_FILENO, status);
      err_relays_.emplace_back(spec.rank, STDERR_FILENO, status);
    }
  }

  // `ended` (an elastic job's): asked every 200 ms while the workers run; a reason it returns ends the group
  // (MEMBERSHIP_CHANGED).
  GroupResult supervise(const std::function<std::string()>& ended = {}) {
    struct Forget {  // what the launcher says at the end goes below the last status, not over it
      StatusLine& status;
      ~Forget() { status.forget(); }
    } forget{status_};
    while (true) {
      if (ended) {
        if (const std::string why = ended(); !why.empty()) {
          status_.forget();
          say("the rendezvous round ended (" + why + "): stopping " + std::to_string(running_count()) +
              " worker(s) to join the next");
          stop(SIGTERM, options_.stop_grace, "for the next rendezvous round");
          return {GroupEnd::MEMBERSHIP_CHANGED, 0, 0, why};
        }
      }
      int sig = wait_and_relay(std::chrono::milliseconds(200));
      if (sig != 0) {
        status_.forget();
        say("received " + signal_name(sig) + ", passing it to " + std::to_string(running_count()) +
            " worker(s); SIGKILL in " + seconds(options_.preempt_grace) + " (a second signal: now)");
        stop(sig, options_.preempt_grace);
        // Workers that all ended on their own with one code (a trainer's "preempted, checkpoint saved") speak for
        // the job; otherwise it ends as the signal ended it.
        const std::optional<int> code = common_exit_code();
        return {GroupEnd::LAUNCHER_SIGNALED, code ? *code : 128 + sig, 0, ""};
      }
      bool all_ok = true;
      for (auto& w : workers_) {
        auto status = w->poll_exit();
        if (!status) {
          all_ok = false;
          continue;
        }
        if (!status->ok()) status_.forget();
        if (status->preempted()) {  // it saved and left: the others are leaving the same way
          say("rank " + std::to_string(w->rank()) + " was preempted (exit " + std::to_string(kPreemptedExitCode) +
              "); waiting for the other " + std::to_string(running_count()) + " worker(s)");
          stop(0, options_.preempt_grace);
          return {GroupEnd::PREEMPTED, kPreemptedExitCode, 0, ""};
        }
        if (!status->ok()) {
          drain_output(*w);  // its last words before the launcher's verdict
          // The root cause: the first rank to fail, with the error it recorded (TORCHELASTIC_ERROR_FILE).
          const auto error = read_error_file(error_file_of(error_dir_, w->rank()));
          say("rank " + std::to_string(w->rank()) + " (pid " + std::to_string(w->pid()) + ") " + status->describe() +
              (error ? ": " + *error : "") + "; stopping the other " + std::to_string(running_count()) +
              " worker(s)");
          stop(SIGTERM, options_.stop_grace, "because rank " + std::to_string(w->rank()) + " failed");
          say("root cause: rank " + std::to_string(w->rank()) + " " + status->describe() +
              (error ? ": " + *error : " (it recorded no error)"));
          if (const int64_t batch = retry_batch(); batch > 0) {
            return {GroupEnd::OUT_OF_MEMORY, kOutOfMemoryExitCode, batch, "an out-of-memory"};
          }
          return {GroupEnd::WORKER_FAILED, status->shell_code(), 0,
                  "rank " + std::to_string(w->rank()) + " " + status->describe()};
        }
      }
      if (all_ok) {
        stop(SIGKILL, std::chrono::milliseconds(0));  // whatever the workers left running in their process groups
        return {GroupEnd::SUCCESS, 0, 0, ""};
      }
    }
  }

 private:
  int running_count() const {
    int n = 0;
    for (const auto& w : workers_) n += w->running() ? 1 : 0;
    return n;
  }

  // Polls the workers' output and the signal pipe for up to `timeout`; relays output. Returns a terminating
  // signal the launcher received, or 0.
  int wait_and_relay(std::chrono::milliseconds timeout) {
    std::vector<pollfd> fds{{signals_.read_fd(), POLLIN, 0}};
    std::vector<std::pair<size_t, bool>> owners;  // (worker index, is stderr)
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i]->stdout_fd() >= 0) fds.push_back({workers_[i]->stdout_fd(), POLLIN, 0}), owners.push_back({i, false});
      if (workers_[i]->stderr_fd() >= 0) fds.push_back({workers_[i]->stderr_fd(), POLLIN, 0}), owners.push_back({i, true});
    }
    int ready = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (ready <= 0) return 0;
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [index, is_err] = owners[k - 1];
      Worker& w = *workers_[index];
      LineRelay& relay = is_err ? err_relays_[index] : out_relays_[index];
      if (!pump(fds[k].fd, relay)) is_err ? w.close_stderr() : w.close_stdout();
    }
    return (fds[0].revents & POLLIN) ? signals_.drain() : 0;
  }

  // [Note: a smaller batch after an out-of-memory] (launch.h) The smallest batch a worker recorded to retry with in
  // this attempt's error file (each is removed before the attempt starts); 0 when none did. Every worker is looked
  // at, whatever it ended with: the others may have failed first, in a collective the out-of-memory rank left, or
  // been stopped between recording and exiting.
  int64_t retry_batch() const {
    int64_t smallest = 0;
    for (const auto& w : workers_) {
      const auto text = read_error_info(error_file_of(error_dir_, w->rank()), kRetryBatchKey);
      try {
        const int64_t batch = text ? std::stoll(*text) : 0;
        if (batch > 0 && (smallest == 0 || batch < smallest)) smallest = batch;
      } catch (const std::exception&) {
        // not a number: this worker asked for nothing usable
      }
    }
    return smallest;
  }

  // The one exit code every worker ended with on its own (no signal), if they agree.
  std::optional<int> common_exit_code() const {
    std::optional<int> code;
    for (const auto& w : workers_) {
      const auto& status = w->status();
      if (!status || status->signaled || (code && *code != status->code)) return std::nullopt;
      code = status->code;
    }
    return code;
  }

  // Sends `sig` (0: none, only wait) to every running worker's process group, relays output while they stop, kills
  // what is left after `grace`, then drains and closes the pipes. A terminating signal to the launcher meanwhile
  // skips the rest of the grace period.
  void stop(int sig, std::chrono::milliseconds grace, const std::string& why = "") {
    std::vector<Worker*> stopped;
    for (auto& w : workers_) {
      if (!w->running()) continue;
      if (sig != 0) w->signal_group(sig);
      stopped.push_back(w.get());
    }
    const auto deadline = Clock::now() + grace;
    while (running_count() > 0 && Clock::now() < deadline) {
      if (wait_and_relay(std::chrono::milliseconds(50)) != 0) break;
      for (auto& w : workers_) w->poll_exit();
    }
    for (auto& w : workers_) {
      w->signal_group(SIGKILL);  // the stragglers, and children of workers that already exited
    }
    for (auto& w : workers_) {
      while (w->running()) {
        w->poll_exit();
        if (w->running()) ::usleep(1000);
      }
    }
    // Output already written to the pipes is still relayed; a pipe held open by an escaped grandchild is given up.
    const auto drain_deadline = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < drain_deadline && any_pipe_open()) wait_and_relay(std::chrono::milliseconds(50));
    for (size_t i = 0; i < workers_.size(); ++i) {
      out_relays_[i].flush();
      err_relays_[i].flush();
      workers_[i]->close_stdout();
      workers_[i]->close_stderr();
    }
    if (sig == SIGKILL) return;  // the clean-up after a success: nothing to report
    status_.forget();
    for (const Worker* w : stopped) {
      say("stopped rank " + std::to_string(w->rank()) + " (pid " + std::to_string(w->pid()) + ")" +
          (why.empty() ? "" : " " + why) + ": " + w->status()->describe());
    }
  }

  // Relays what a worker already wrote (non-blocking).
  void drain_output(Worker& w) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].get() != &w) continue;
      if (w.stdout_fd() >= 0 && !pump(w.stdout_fd(), out_relays_[i])) w.close_stdout();
      if (w.stderr_fd() >= 0 && !pump(w.stderr_fd(), err_relays_[i])) w.close_stderr();
    }
  }

  bool any_pipe_open() const {
    for (const auto& w : workers_) {
      if (w->stdout_fd() >= 0 || w->stderr_fd() >= 0) return true;
    }
    return false;
  }

  const LaunchOptions& options_;
  SignalPipe& signals_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<LineRelay> out_relays_;
  std::vector<LineRelay> err_relays_;
  std::string error_dir_;
  StatusLine& status_;
};

// Refuses a node's worker count that cannot run well here, before anything starts: far more workers than cores
// (each would get a sliver of a core and the collectives would time out), or more files than the open-file limit
// allows (the launcher keeps two pipes per worker; each worker's Gloo mesh holds sockets to every other rank).
void check_node_capacity(const LaunchOptions& o) {
  constexpr int kMaxWorkersPerCore = 8;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && o.nproc_per_node > kMaxWorkersPerCore * cores) {
    throw std::invalid_argument("--nproc-per-node " + std::to_string(o.nproc_per_node) + " is more than " +
                                std::to_string(kMaxWorkersPerCore) + " workers per core on this machine (" +
                                std::to_string(cores) + " cores online): expected at most " +
                                std::to_string(kMaxWorkersPerCore * cores));
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) return;
  const long world = static_cast<long>(o.nnodes) * o.nproc_per_node;
  const long launcher_needs = 2L * o.nproc_per_node + 32, worker_needs = 3 * world + 64;
  const long needs = std::max(launcher_needs, worker_needs);
  if (needs > static_cast<long>(files.rlim_cur)) {
    throw std::invalid_argument("--nproc-per-node " + std::to_string(o.nproc_per_node) + " over " +
                                std::to_string(o.nnodes) + " node(s) needs about " + std::to_string(needs) +
                                " open files per process (pipes, and sockets to every other rank), above the " +
                                "open-file limit " + std::to_string(files.rlim_cur) + " (raise it with ulimit -n)");
  }
}

// The launcher's variables that the environment already holds (a stray RANK=0 from an outer script): the workers
// get the launcher's own, and the launcher says so.
void say_replaced_variables() {
  std::string found;
  for (const char* name : kLauncherVariables) {
    const char* value = std::getenv(name);
    if (value != nullptr) found += std::string(found.empty() ? "" : " ") + name + "=" + value;
  }
  if (!found.empty()) say("the environment's " + found + " are not this launcher's: its workers get their own");
}

// This host's name and the launcher's pid: how the other nodes' messages name this one.
std::string node_name() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(::getpid());
}

// --nnodes MIN:MAX. The launcher that can bind the endpoint serves the job's store for every round (the others
// cannot: the port is taken, or the address is another host's) and the rest are its clients; all meet in the
// rendezvous's rounds (launch/elastic_rendezvous.h), run their workers as the round's nodes, and join the next
// round when it ends. A failure of this node's workers counts against --max-restarts; a round ended by a membership
// change does not.
constexpr int kUsageExitCode = 2;  // what `shardtrain train` (and a shell's usage error) exits with on bad input

int run_elastic(const LaunchOptions& options) {
  const std::string host = options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  const int port = options.master_port != 0 ? options.master_port : 29500;
  const std::string job_id = job_id_of(options);
  say_replaced_variables();
  std::unique_ptr<ListenSocket> listen_socket;
  std::unique_ptr<AgentStore> served;
  try {
    listen_socket = std::make_unique<ListenSocket>(host, port, options.master_port_option);
    served = std::make_unique<AgentStore>(listen_socket->fd(), host, port, job_id);
  } catch (const std::runtime_error&) {
    listen_socket.reset();  // another launcher serves it (or nothing does yet: the client's connect waits)
  }
  c10d::TCPStoreOptions client_options;
  client_options.port = static_cast<std::uint16_t>(port);
  client_options.isServer = false;
  client_options.waitWorkers = false;
  client_options.timeout = options.join_timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(host, client_options);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot reach the rendezvous at " + host + ":" + std::to_string(port) + ": " + e.what());
  }
  const std::vector<uint8_t> theirs = store->get("shardtrain/job_id");
  if (std::string(theirs.begin(), theirs.end()) != job_id) {
    throw std::runtime_error("the rendezvous at " + host + ":" + std::to_string(port) + " is job '" +
                             std::string(theirs.begin(), theirs.end()) + "''s, not '" + job_id + "' (--rdzv-id)");
  }
  ElasticOptions elastic;
  elastic.min_nodes = options.min_nodes, elastic.max_nodes = options.nnodes;
  elastic.last_call = options.last_call, elastic.join_timeout = options.join_timeout;
  elastic.keep_alive_interval = options.keep_alive_interval;
  elastic.keep_alive_max_attempt = options.keep_alive_max_attempt;
  elastic.node_name = node_name();
  ElasticRendezvous rendezvous(store, elastic);
  say("elastic: " + std::to_string(options.min_nodes) + " to " + std::to_string(options.nnodes) + " nodes of " +
      std::to_string(options.nproc_per_node) + " worker(s), rendezvous at " + host + ":" + std::to_string(port) +
      (served ? " (served here)" : ""));

  // The job is over for every node: this one has heard, and the one serving the store keeps it up until the
  // others of the last round have too (a store that is gone by then has nothing more to say).
  const auto leave = [&](int nodes) {
    try {
      rendezvous.leave();
      if (served) rendezvous.wait_for_leaving(nodes, options.keep_alive_interval * options.keep_alive_max_attempt);
    } catch (const std::exception&) {
    }
  };
  const ErrorDirectory errors;
  StatusLine status;
  SignalPipe signals;
  int failures = 0, nodes = 1;
  while (true) {
    Membership m;
    try {
      m = rendezvous.join(say);
    } catch (const JobEnded& e) {
      say(std::string("the job ended on another node: ") + e.what());
      leave(nodes);
      return kUsageExitCode;
    }
    nodes = m.nnodes;
    say("rendezvous round " + std::to_string(m.round) + ": node " + std::to_string(m.node_rank) + " of " +
        std::to_string(m.nnodes) + ", ranks " + std::to_string(m.node_rank * options.nproc_per_node) + "-" +
        std::to_string((m.node_rank + 1) * options.nproc_per_node - 1) + " of " +
        std::to_string(m.nnodes * options.nproc_per_node));
    LaunchOptions round = options;
    round.nnodes = m.nnodes, round.node_rank = m.node_rank;
    GroupResult result;
    {
      WorkerGroup group(round, host, port, m.round, job_id, errors.path, 0, signals, status);
      result = group.supervise([&] { return rendezvous.ended(m); });
    }
    if (result.end == GroupEnd::MEMBERSHIP_CHANGED) continue;
    if (result.end == GroupEnd::SUCCESS) {
      // The store stays up until every node's workers are done with it (torchrun's exit barrier: 300 s). The node
      // serving it leaves as soon as all have: a store that goes while this node waits has nothing more to do here.
      try {
        if (const int left = rendezvous.finish(m, std::chrono::seconds(300)); left > 0) {
          say(std::to_string(left) + " node(s) of the round had not finished after 300 s; leaving");
        }
      } catch (const std::exception&) {
        // the store is gone: its node left having seen every node finish (or died; this node is done either way)
      }
      return 0;
    }
    if (result.end != GroupEnd::WORKER_FAILED && result.end != GroupEnd::OUT_OF_MEMORY) return result.exit_code;
    const std::string failed = "node " + std::to_string(m.node_rank) + " (" + elastic.node_name + "): " + result.why;
    // Exit 2 is a program refusing its input — a trainer whose parallel layout the round's world size cannot hold
    // (a tp or pp size the surviving ranks do not divide): another round of the same size would refuse it again.
    if (result.exit_code == kUsageExitCode) {
      const std::string why = failed + " (exit " + std::to_string(kUsageExitCode) + ": its input refused at " +
                              std::to_string(m.nnodes * options.nproc_per_node) + " ranks)";
      try {
        rendezvous.end_job(why);
      } catch (const std::exception&) {
        // the store is gone: another node ended the job first
      }
      say("the job ends: " + why + ", which another round would not change");
      leave(m.nnodes);
      return result.exit_code;
    }
    rendezvous.end(m.round, failed);
    if (failures >= options.max_restarts) {
      if (options.max_restarts > 0) say("giving up after " + std::to_string(options.max_restarts) + " restart(s)");
      return result.exit_code;
    }
    ++failures;
    say("joining the next rendezvous round (restart " + std::to_string(failures) + " of " +
        std::to_string(options.max_restarts) + ")");
  }
}

}  // namespace

int run_launch(const LaunchOptions& options) {
  if (options.command.empty()) throw std::invalid_argument("no program to launch");
  check_node_capacity(options);
  if (options.min_nodes > 0) return run_elastic(options);
  const bool single_node = options.nnodes == 1;
  const std::string master_addr = options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  // [Note: launcher-owned rendezvous socket] On one node the launcher binds the rendezvous port itself (port 0 asks
  // the kernel for a free one) on MASTER_ADDR, loopback by default, and serves the job's store on it
  // (agent_store.h). No port is guessed, no other process can take it between choosing and using it, and nothing
  // listens beyond loopback unless asked. Across nodes the launcher of node 0 does the same on
  // MASTER_ADDR:MASTER_PORT (29500 by default): the rendezvous listens on the interface the other nodes were told,
  // not on every interface as torchrun's does.
  std::unique_ptr<ListenSocket> listen_socket;
  int master_port = options.master_port != 0 ? options.master_port : 29500;
  if (single_node || options.node_rank == 0) {
    listen_socket = std::make_unique<ListenSocket>(master_addr, single_node ? options.master_port : master_port,
                                                   options.master_port_option);
    master_port = listen_socket->port();
  }

  const std::string job_id = job_id_of(options);
  say_replaced_variables();

  const ErrorDirectory errors;
  StatusLine status;
  SignalPipe signals;
  int failures = 0, batch_retries = 0;  // restarts of each kind so far
  int64_t batch_limit = 0;
  for (int attempt = 0;; ++attempt) {
    GroupResult result;
    {
      // A fresh store for each attempt, before its workers start and until they are gone.
      std::unique_ptr<AgentStore> store;
      if (listen_socket) store = std::make_unique<AgentStore>(listen_socket->fd(), master_addr, master_port, job_id);
      WorkerGroup group(options, master_addr, master_port, attempt, job_id, errors.path, batch_limit, signals,
                        status);
      result = group.supervise();
    }
    if (result.end == GroupEnd::OUT_OF_MEMORY && batch_retries < kMaxBatchRetries) {
      batch_limit = result.retry_batch, ++batch_retries;
      say("restarting the worker group with train.batch_size auto at most " + std::to_string(batch_limit) +
          " per rank, after an out-of-memory in the first two steps (retry " + std::to_string(batch_retries) +
          " of " + std::to_string(kMaxBatchRetries) + ")");
      continue;
    }
    if (result.end == GroupEnd::OUT_OF_MEMORY) {
      say("giving up on smaller batches after " + std::to_string(kMaxBatchRetries) + " restarts for them");
    }
    if (result.end != GroupEnd::WORKER_FAILED && result.end != GroupEnd::OUT_OF_MEMORY) return result.exit_code;
    if (failures >= options.max_restarts) {
      if (options.max_restarts > 0) say("giving up after " + std::to_string(options.max_restarts) + " restart(s)");
      return result.exit_code;
    }
    ++failures;
    say("restarting the worker group (restart " + std::to_string(failures) + " of " +
        std::to_string(options.max_restarts) + ")");
  }
}

}  // namespace shardtrain::launch
