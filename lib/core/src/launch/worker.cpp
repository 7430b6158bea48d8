#include "launch/worker.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "launch/output_relay.h"

namespace shardtrain::launch {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string ExitStatus::describe() const {
  if (signaled) return "was killed by signal " + std::to_string(signal) + " (" + signal_name(signal) + ")";
  return "exited with code " + std::to_string(code);
}

Worker::Worker(const WorkerSpec& spec) : rank_(spec.rank) {
  // Everything the child needs is built before fork: after it only async-signal-safe calls are made.
  std::vector<char*> argv, envp;
  for (const auto& a : spec.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_error = "shardtrain launch: cannot execute '" + spec.command.at(0) + "': ";

  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]), ::close(out_pipe[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid_ == 0) {
    // Child. Own process group, so the launcher can stop the worker with everything it started.
    ::setpgid(0, 0);
    // Die with the launcher, even when it is killed with SIGKILL; if it already died, stop now.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    // The launcher ignores SIGPIPE and blocks nothing else; ignored dispositions survive exec, so reset them.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    const char* reason = std::strerror(errno);
    write_all(STDERR_FILENO, exec_error.data(), exec_error.size());
    write_all(STDERR_FILENO, reason, std::strlen(reason));
    write_all(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  // Parent. Also set the group from this side, so a signal sent right after fork cannot miss it.
  ::setpgid(pid_, pid_);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  out_fd_ = out_pipe[0];
  err_fd_ = err_pipe[0];
  for (int fd : {out_fd_, err_fd_}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

Worker::~Worker() {
  if (running()) {
    signal_group(SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    signal_group(SIGKILL);  // children the worker left behind in its group
  }
  close_stdout();
  close_stderr();
}

void Worker::close_stdout() {
  if (out_fd_ >= 0) ::close(out_fd_), out_fd_ = -1;
}

void Worker::close_stderr() {
  if (err_fd_ >= 0) ::close(err_fd_), err_fd_ = -1;
}

std::optional<ExitStatus> Worker::poll_exit() {
  if (status_) return status_;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return std::nullopt;
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signaled = true;
    s.signal = WTERMSIG(status);
  } else {
    s.code = WEXITSTATUS(status);
  }
  status_ = s;
  return status_;
}

void Worker::signal_group(int sig) const {
  if (pid_ > 0) ::kill(-pid_, sig);
}

}  // namespace shardtrain::launch
