// `shardtrain config`: the questions `accelerate config` asks, answered into a YAML config for `shardtrain train`.
// Every answer is applied as an override of the config tree, so a bad answer gets the tree's own error and the
// question is asked again.
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "cli_args.h"
#include "commands.h"
#include "shardtrain/config/config.h"
#include "shardtrain/io/files.h"

namespace shardtrain::cli {
namespace {

struct Question {
  std::string key;     // the config key the answer sets
  std::string prompt;
  std::string fallback;
  bool (*applies)(const config::Config&) = nullptr;  // null: always asked
};

const std::vector<Question>& questions() {
  static const std::vector<Question> q = {
      {"model.flavor", "Which model flavor (`shardtrain models` lists them)?", "flava-debug"},
      {"launch.num_machines", "How many machines?", "1"},
      {"launch.machine_rank", "What is the rank of this machine?", "0",
       [](const config::Config& c) { return c.launch.num_machines > 1; }},
      {"launch.main_process_ip", "What is the IP address of the machine that will host the main process?", "",
       [](const config::Config& c) { return c.launch.num_machines > 1; }},
      {"launch.main_process_port", "What is the port of the main process?", "29500",
       [](const config::Config& c) { return c.launch.num_machines > 1; }},
      {"launch.num_processes", "How many processes in total (all machines)?", "1"},
      {"train.device", "Which device (auto: a GPU when one is visible; cpu, cuda)?", "auto"},
      {"parallel.strategy",
       "Sharding strategy (full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2, ddp)?",
       "full_shard"},
      {"parallel.mixed_precision", "Mixed precision (no, bf16, fp16)?", "no"},
      {"parallel.wrap", "Auto wrap policy (transformer, size, none)?", "transformer",
       [](const config::Config& c) { return c.parallel.strategy != parallel::Strategy::DDP; }},
      {"parallel.layer_classes", "Transformer layer classes to wrap, comma-separated (empty: the model's own)?", "",
       [](const config::Config& c) {
         return c.parallel.strategy != parallel::Strategy::DDP && c.parallel.wrap == parallel::Wrap::TRANSFORMER;
       }},
      {"parallel.min_params", "Minimum number of parameters of a unit?", "100000000",
       [](const config::Config& c) {
         return c.parallel.strategy != parallel::Strategy::DDP && c.parallel.wrap == parallel::Wrap::SIZE;
       }},
      {"parallel.backward_prefetch", "Backward prefetch (backward_pre, backward_post, none)?", "backward_pre",
       [](const config::Config& c) { return c.parallel.strategy != parallel::Strategy::DDP; }},
      {"parallel.forward_prefetch", "Units to all-gather ahead in forward (0 = none)?", "0",
       [](const config::Config& c) { return c.parallel.strategy != parallel::Strategy::DDP; }},
      {"parallel.cpu_offload", "Offload parameters and gradients to CPU (yes/no)?", "no",
       [](const config::Config& c) { return c.parallel.strategy != parallel::Strategy::DDP; }},
      {"parallel.activation_checkpointing", "Use activation checkpointing (yes/no)?", "no"},
      {"checkpoint.state_dict_type", "Checkpoint state dict type (sharded, full)?", "sharded"},
  };
  return q;
}

// The answer as a YAML value: lists for layer classes, the text otherwise.
std::string as_value(const std::string& key, const std::string& answer) {
  if (key != "parallel.layer_classes") return answer;
  std::string list = "[";
  size_t start = 0;
  while (start <= answer.size()) {
    size_t comma = answer.find(',', start);
    if (comma == std::string::npos) comma = answer.size();
    std::string item = answer.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) list += (list.size() > 1 ? "," : "") + item;
    start = comma + 1;
  }
  return list + "]";
}

}  // namespace

int run_config_command(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv, {"out"}, {"default", "help"});
  if (a.has("help")) {
    std::cout << "usage: shardtrain config [--default] [--out FILE]\n"
                 "Asks how the job should run (machines, processes, strategy, precision, wrapping, offload,\n"
                 "checkpointing) and writes a YAML config for `shardtrain train` (default file:\n"
                 "shardtrain_config.yaml). --default prints the defaults without asking (to FILE with --out);\n"
                 "--out - prints the answers.\n";
    return 0;
  }
  // Answers go to a file by default, as `accelerate config` writes its default config file; the defaults alone are
  // printed, for a look or a redirect.
  const std::string out = a.get("out", a.has("default") ? "-" : "shardtrain_config.yaml");
  config::Config config;
  if (!a.has("default")) {
    for (const auto& q : questions()) {
      if (q.applies && !q.applies(config)) continue;
      while (true) {
        std::cout << q.prompt << " [" << q.fallback << "]: " << std::flush;
        std::string answer;
        if (!std::getline(std::cin, answer)) throw std::runtime_error("config: input ended before all answers");
        if (answer.empty()) answer = q.fallback;
        try {
          config::Config trial = config;
          config::apply_overrides(trial, {"--" + q.key + "=" + as_value(q.key, answer)});
          config = trial;
          break;
        } catch (const config::ConfigError& e) {
          std::cout << "  " << e.what() << "\n";
        }
      }
    }
  }
  config::validate(config);  // values against each other (processes a multiple of machines, ...)
  const std::string yaml = "# shardtrain config (`shardtrain train " + (out == "-" ? std::string("CONFIG") : out) +
                           "`); every key is listed with its value\n" + config::to_yaml(config, /*annotated=*/true);
  if (out == "-") {
    std::cout << yaml;
  } else {
    io::write_file_atomic(out, std::vector<char>(yaml.begin(), yaml.end()));
    std::cout << "config: wrote " << out << "\n";
  }
  return 0;
}

bool isatty_stderr() { return ::isatty(2) != 0; }
bool isatty_stdin() { return ::isatty(0) != 0; }

}  // namespace shardtrain::cli
