// The `shardtrain` command line: one executable, one sub-command per verb (Accelerate's verbs where they exist).
// Library code throws; this is the one place that turns exceptions into messages and exit codes.
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "shardtrain/launch/error_file.h"
#include "shardtrain/launch/launch.h"
#include "shardtrain/models/zoo.h"

namespace {

const char* kUsage =
    "usage: shardtrain <command> [options]\n"
    "commands:\n"
    "  train     train a model of the zoo from a YAML config (sharded, multi-process, checkpointed)\n"
    "  config    write a config for `shardtrain train` by answering questions (--default: without asking)\n"
    "  launch    start N workers with torchrun's environment and supervise them\n"
    "  data      synthetic data (synth), vocabularies (vocab), a table's columns (show), packing ahead (pack)\n"
    "  checkpoint  export a checkpoint to one safetensors file with Hugging Face names; verify, list checkpoints\n"
    "  models    list the model zoo: every flavor with its exact parameter count and float32 size\n"
    "  estimate-memory  the memory a model needs to load and train (Accelerate's table; a job's peak per rank), from\n"
    "            a flavor, a config.json or a trainer's CONFIG.yaml\n"
    "  plan      the configurations that fit N GPUs, each with its largest batch and predicted speed\n"
    "  generate  continue prompts with a causal LM or T5 (a Hugging Face model directory), as transformers' generate\n"
    "  report    a run's curves (losses, evaluation, speed, memory per rank) as PNG and SVG\n"
    "  env       versions, GPUs, CPUs, memory, launcher and cache directories (for a bug report)\n"
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

// Counts come from shapes (each model is built on the meta device), so even llama-3-70b costs no memory.
int run_models_command(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::cout << "usage: shardtrain models\n"
                 "Lists every flavor of every family with its exact parameter count (tied weights once) and its\n"
                 "size in float32 (GiB = 2^30 bytes, the unit of the FLAVA post's table), then the dimensions\n"
                 "model.overrides may change in each family.\n";
    return args[0] == "--help" || args[0] == "-h" ? 0 : 2;
  }
  std::printf("%-8s %-24s %16s %12s\n", "family", "flavor", "parameters", "fp32 GiB");
  for (const auto& f : shardtrain::models::list_flavors()) {
    const int64_t params = shardtrain::models::count_flavor_parameters(f.flavor);
    std::printf("%-8s %-24s %16lld %12.2f\n", f.family.c_str(), f.flavor.c_str(), static_cast<long long>(params),
                static_cast<double>(params) * 4.0 / (1024.0 * 1024.0 * 1024.0));
  }
  std::printf("\nA custom size: a flavor with model.overrides ({layers: 4, dim: 512}) of its family's:\n");
  for (const auto& [family, names] : shardtrain::models::override_names()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    std::printf("  %-8s %s\n", family.c_str(), list.c_str());
  }
  return 0;
}

// The message on stderr, and in the launcher's error file (the job's root cause when this rank fails first).
int fail(const std::string& command, const std::string& message, int code) {
  std::cerr << "shardtrain " << command << ": error: " << message << "\n";
  shardtrain::launch::record_error(message);
  return code;
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
    if (command == "models") return run_models_command(args);
    if (command == "data") return shardtrain::cli::run_data_command(args);
    if (command == "config") return shardtrain::cli::run_config_command(args);
    if (command == "train") return shardtrain::cli::run_train_command(args);
    if (command == "checkpoint") return shardtrain::cli::run_checkpoint_command(args);
    if (command == "estimate-memory") return shardtrain::cli::run_estimate_command(args);
    if (command == "plan") return shardtrain::cli::run_plan_command(args);
    if (command == "generate") return shardtrain::cli::run_generate_command(args);
    if (command == "report") return shardtrain::cli::run_report_command(args);
    if (command == "env") return shardtrain::cli::run_env_command(args);
    if (command == "version") {
      std::cout << "shardtrain " << SHARDTRAIN_VERSION << "\n";
      return 0;
    }
    std::cerr << "shardtrain: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const std::invalid_argument& e) {  // bad input: options, config, data paths
    return fail(command, e.what(), 2);
  } catch (const c10::Error& e) {  // LibTorch's what() carries a C++ backtrace; the message is what users need
    return fail(command, e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return fail(command, e.what(), 1);
  }
}
