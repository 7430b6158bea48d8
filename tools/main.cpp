// The `shardtrain` command line: one executable, one sub-command per verb (Accelerate's verbs where they exist).
// Library code throws; this is the one place that turns exceptions into messages and exit codes.
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "shardtrain/launch/launch.h"

namespace {

const char* kUsage =
    "usage: shardtrain <command> [options]\n"
    "commands:\n"
    "  launch    start N workers with torchrun's environment and supervise them\n"
    "  version   print the version\n"
    "run 'shardtrain <command> --help' for a command's options\n";

int run_launch_command(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << shardtrain::launch::launch_usage();
    return 0;
  }
  shardtrain::launch::LaunchOptions options;
  try {
    options = shardtrain::launch::parse_launch_args(args);
  } catch (const std::invalid_argument& e) {
    std::cerr << "shardtrain launch: " << e.what() << "\n";
    return 2;
  }
  return shardtrain::launch::run_launch(options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "launch") return run_launch_command(args);
    if (command == "version") {
      std::cout << "shardtrain 0.1.0\n";
      return 0;
    }
    std::cerr << "shardtrain: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "shardtrain " << command << ": error: " << e.what() << "\n";
    return 1;
  }
}
