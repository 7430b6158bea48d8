// `shardtrain report RUN_DIR... [--out DIR]`: the run's figures, drawn by scripts/report.py with matplotlib (the
// ecosystem's plotting library; nothing is drawn by hand here). The script and the Python that runs it are the
// source tree's and its .venv's, recorded at build time; SHARDTRAIN_PYTHON and SHARDTRAIN_REPORT_SCRIPT override
// them (an installed copy).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "shardtrain/io/files.h"

namespace shardtrain::cli {
namespace {

const char* kReportUsage =
    "usage: shardtrain report RUN_DIR [RUN_DIR...] [--out DIR]\n"
    "Draws a run's log.dir (metrics.csv, eval.csv) as report.png and report.svg: each loss (log scale), the\n"
    "held-out evaluation, items/s and MFU, peak memory per rank, over the steps. Several runs share the panels,\n"
    "one colour each. --out: where the figures go (default: the first RUN_DIR).\n";

std::string setting(const char* variable, const char* built_in) {
  const char* value = std::getenv(variable);
  return value && *value ? value : built_in;
}

}  // namespace

int run_report_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kReportUsage;
    return args.empty() ? 2 : 0;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out") {
      if (++i == args.size()) throw std::invalid_argument("--out needs a directory");
    } else if (args[i].rfind("--", 0) == 0) {
      throw std::invalid_argument("unknown option '" + args[i] + "' (expected RUN_DIR... [--out DIR])");
    } else if (!io::path_exists(args[i] + "/metrics.csv")) {
      throw std::invalid_argument("'" + args[i] + "' holds no metrics.csv: expected a run's log.dir");
    }
  }
  const std::string python = setting("SHARDTRAIN_PYTHON", SHARDTRAIN_BUILD_PYTHON);
  const std::string script = setting("SHARDTRAIN_REPORT_SCRIPT", SHARDTRAIN_SOURCE_DIR "/scripts/report.py");
  if (!io::path_exists(script)) {
    throw std::runtime_error("the report script '" + script + "' is not there (set SHARDTRAIN_REPORT_SCRIPT)");
  }
  std::vector<std::string> argv = {python, script};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execvp(cargv[0], cargv.data());
    std::cerr << "shardtrain report: cannot run " << python << " (set SHARDTRAIN_PYTHON to a Python with "
              << "matplotlib)\n";
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace shardtrain::cli
