// One worker process of the launcher: spawned with its own environment, its stdout/stderr captured through pipes,
// in its own process group, and killed by the kernel if the launcher dies (private to the launch layer).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "shardtrain/launch/launch.h"

namespace shardtrain::launch {

// How a process ended, from waitpid's status.
struct ExitStatus {
  int code = 0;    // exit code when !signaled
  int signal = 0;  // terminating signal when signaled
  bool signaled = false;
  bool ok() const { return !signaled && code == 0; }
  bool preempted() const { return !signaled && code == kPreemptedExitCode; }
  int shell_code() const { return signaled ? 128 + signal : code; }  // what a shell would report
  std::string describe() const;  // "exited with code 3", "was killed by signal 9 (SIGKILL)"
};

struct WorkerSpec {
  int rank = 0;
  std::vector<std::string> command;  // argv; argv[0] is looked up on PATH
  std::vector<std::string> env;      // full environment, "NAME=value"
};

class Worker {
 public:
  // Forks and execs. A program that cannot be executed exits 127 with the reason on its stderr.
  explicit Worker(const WorkerSpec& spec);
  ~Worker();  // kills the process group if still running and closes the pipes
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_fd_; }  // -1 once closed
  int stderr_fd() const { return err_fd_; }
  void close_stdout();
  void close_stderr();

  // Non-blocking reap; returns the status once the process has ended.
  std::optional<ExitStatus> poll_exit();
  bool running() const { return !status_; }
  const std::optional<ExitStatus>& status() const { return status_; }

  // Sends `sig` to the worker's whole process group (the worker and anything it started).
  void signal_group(int sig) const;

 private:
  int rank_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::optional<ExitStatus> status_;
};

std::string signal_name(int sig);

}  // namespace shardtrain::launch
