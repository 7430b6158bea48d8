#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/launch/launch.h"
#include "shardtrain/util/closest_match.h"

namespace shardtrain::launch {
namespace {

// Canonical option names (dashes). Each maps to what it sets; Accelerate's names are kept apart because
// --num-processes counts every process of the job, not those of one node.
enum class Opt {
  NPROC_PER_NODE,
  NNODES,
  NODE_RANK,
  MASTER_ADDR,
  MASTER_PORT,
  MAX_RESTARTS,
  PREEMPT_GRACE,
  RDZV_ID,
  NUM_PROCESSES,
  GPU_IDS,
  RDZV_ENDPOINT,
  RDZV_CONF,
};

const std::map<std::string, Opt>& option_table() {
  static const std::map<std::string, Opt> table = {
      {"nproc-per-node", Opt::NPROC_PER_NODE}, {"nnodes", Opt::NNODES},
      {"node-rank", Opt::NODE_RANK},           {"master-addr", Opt::MASTER_ADDR},
      {"master-port", Opt::MASTER_PORT},       {"max-restarts", Opt::MAX_RESTARTS},
      {"num-processes", Opt::NUM_PROCESSES},   {"num-machines", Opt::NNODES},
      {"machine-rank", Opt::NODE_RANK},        {"main-process-ip", Opt::MASTER_ADDR},
      {"main-process-port", Opt::MASTER_PORT}, {"preempt-grace", Opt::PREEMPT_GRACE},
      {"rdzv-id", Opt::RDZV_ID},               {"gpu-ids", Opt::GPU_IDS},
      {"rdzv-endpoint", Opt::RDZV_ENDPOINT},   {"rdzv-conf", Opt::RDZV_CONF},
  };
  return table;
}

std::string closest_option(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& [candidate, _] : option_table()) names.push_back(candidate);
  return util::closest_match(name, names);
}

int parse_count(const std::string& option, const std::string& value, int minimum) {
  size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || parsed < minimum || parsed > 1'000'000) {
    throw std::invalid_argument("--" + option + " '" + value + "' is not an integer >= " + std::to_string(minimum));
  }
  return static_cast<int>(parsed);
}

// Seconds as a decimal number ("30", "0.5") -> milliseconds.
std::chrono::milliseconds parse_seconds(const std::string& option, const std::string& value) {
  size_t used = 0;
  double parsed = -1;
  try {
    parsed = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || !(parsed >= 0) || parsed > 86400) {
    throw std::invalid_argument("--" + option + " '" + value + "' is not a number of seconds in [0, 86400]");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(parsed * 1000.0));
}

// --nnodes N, or MIN:MAX (elastic): sets nnodes (MAX) and min_nodes (0 when static).
void parse_nnodes(const std::string& option, const std::string& value, LaunchOptions& o) {
  const size_t colon = value.find(':');
  if (colon == std::string::npos) {
    o.nnodes = parse_count(option, value, 1);
    return;
  }
  o.min_nodes = parse_count(option, value.substr(0, colon), 1);
  o.nnodes = parse_count(option, value.substr(colon + 1), 1);
  if (o.min_nodes > o.nnodes) {
    throw std::invalid_argument("--" + option + " " + value + ": MIN " + std::to_string(o.min_nodes) +
                                " is greater than MAX " + std::to_string(o.nnodes) + " (expected MIN:MAX, MIN <= MAX)");
  }
}

// --rdzv-endpoint HOST[:PORT].
void parse_endpoint(const std::string& option, const std::string& value, LaunchOptions& o) {
  const size_t colon = value.rfind(':');
  o.master_addr = value.substr(0, colon);
  if (o.master_addr.empty()) throw std::invalid_argument("--" + option + " '" + value + "': expected HOST[:PORT]");
  if (colon != std::string::npos) {
    o.master_port = parse_count(option, value.substr(colon + 1), 1);
    if (o.master_port > 65535) throw std::invalid_argument("--" + option + " '" + value + "': the port is above 65535");
  }
}

// --rdzv-conf key=value,...: torchrun's last_call_timeout, join_timeout, keep_alive_interval (seconds) and
// keep_alive_max_attempt.
void parse_rdzv_conf(const std::string& option, const std::string& value, LaunchOptions& o) {
  size_t at = 0;
  while (at <= value.size()) {
    const size_t end = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, end - at);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), setting = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "last_call_timeout") {
      o.last_call = parse_seconds(option + " last_call_timeout", setting);
    } else if (key == "join_timeout") {
      o.join_timeout = parse_seconds(option + " join_timeout", setting);
    } else if (key == "keep_alive_interval") {
      o.keep_alive_interval = parse_seconds(option + " keep_alive_interval", setting);
    } else if (key == "keep_alive_max_attempt") {
      o.keep_alive_max_attempt = parse_count(option + " keep_alive_max_attempt", setting, 1);
    } else {
      throw std::invalid_argument("--" + option + " '" + item + "': expected last_call_timeout=SECONDS, " +
                                  "join_timeout=SECONDS, keep_alive_interval=SECONDS or keep_alive_max_attempt=N");
    }
    at = end + 1;
  }
}

}  // namespace

std::string gpu_ids_checked(const std::string& option, const std::string& ids) {
  bool ok = !ids.empty();
  if (ids != "all") {
    std::string number;
    for (const char ch : ids + ",") {
      if (ch == ',') {
        ok = ok && !number.empty() && number.size() <= 4;
        number.clear();
      } else {
        ok = ok && std::isdigit(static_cast<unsigned char>(ch));
        number += ch;
      }
    }
  }
  if (!ok) {
    throw std::invalid_argument(option + " '" + ids + "': expected all, or GPU indices separated by commas (0,1)");
  }
  return ids;
}

std::string launch_usage() {
  return "usage: shardtrain launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]\n"
         "                        [--rdzv-id ID] [--max-restarts K] [--preempt-grace SECONDS] [--] PROGRAM [ARGS...]\n"
         "  --rdzv-id: the job's id, the same on every node (needed with --nnodes > 1 outside Slurm)\n"
         "  --nnodes MIN:MAX: elastic, as torchrun: node ranks from the rendezvous at --rdzv-endpoint HOST:PORT\n"
         "    (or --master-addr/--master-port); the job goes on at any node count in the range, re-rendezvousing\n"
         "    when a node is lost or added (--rdzv-conf last_call_timeout=30,join_timeout=600)\n"
         "  --preempt-grace: after SIGTERM/SIGINT, how long the workers get to save before SIGKILL (30)\n"
         "  Accelerate's --num_processes (total), --num_machines, --machine_rank, --main_process_ip,\n"
         "  --main_process_port and --gpu_ids (the GPUs the workers see: CUDA_VISIBLE_DEVICES) are accepted too;\n"
         "  '_' and '-' are interchangeable in option names.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions options;
  std::optional<int> nproc_per_node, num_processes;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--", 0) != 0) break;  // the program
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    std::replace(name.begin(), name.end(), '_', '-');
    auto it = option_table().find(name);
    if (it == option_table().end()) {
      throw std::invalid_argument("unknown option '" + arg + "' (did you mean --" + closest_option(name) + "?)");
    }
    if (!value) {
      if (i + 1 >= args.size()) throw std::invalid_argument("option --" + name + " needs a value");
      value = args[++i];
    }
    switch (it->second) {
      case Opt::NPROC_PER_NODE: nproc_per_node = parse_count(name, *value, 1); break;
      case Opt::NUM_PROCESSES: num_processes = parse_count(name, *value, 1); break;
      case Opt::NNODES: parse_nnodes(name, *value, options); break;
      case Opt::RDZV_ENDPOINT: parse_endpoint(name, *value, options); break;
      case Opt::RDZV_CONF: parse_rdzv_conf(name, *value, options); break;
      case Opt::NODE_RANK: options.node_rank = parse_count(name, *value, 0); break;
      case Opt::MASTER_ADDR:
        if (value->empty()) throw std::invalid_argument("--" + name + " is empty: expected a host name or address");
        options.master_addr = *value;
        break;
      case Opt::MASTER_PORT:
        options.master_port = parse_count(name, *value, 0);  // 0: choose a free port
        if (options.master_port > 65535) {
          throw std::invalid_argument("--" + name + " " + *value + " is not a TCP port (0..65535, 0 = any free one)");
        }
        break;
      case Opt::MAX_RESTARTS: options.max_restarts = parse_count(name, *value, 0); break;
      case Opt::PREEMPT_GRACE: options.preempt_grace = parse_seconds(name, *value); break;
      case Opt::RDZV_ID:
        if (value->empty()) throw std::invalid_argument("--" + name + " is empty: expected the job's id");
        options.rdzv_id = *value;
        break;
      case Opt::GPU_IDS: options.gpu_ids = gpu_ids_checked("--" + name, *value); break;
    }
  }
  options.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (options.command.empty()) throw std::invalid_argument("no program to launch\n" + launch_usage());

  if (num_processes) {
    if (*num_processes % options.nnodes != 0) {
      throw std::invalid_argument("--num-processes " + std::to_string(*num_processes) +
                                  " is not divisible by --num-machines " + std::to_string(options.nnodes));
    }
    const int per_node = *num_processes / options.nnodes;
    if (nproc_per_node && *nproc_per_node != per_node) {
      throw std::invalid_argument("--nproc-per-node " + std::to_string(*nproc_per_node) + " contradicts --num-processes " +
                                  std::to_string(*num_processes) + " over " + std::to_string(options.nnodes) +
                                  " machine(s)");
    }
    nproc_per_node = per_node;
  }
  options.nproc_per_node = nproc_per_node.value_or(1);
  if (options.min_nodes > 0 && options.node_rank != 0) {
    throw std::invalid_argument("--node-rank " + std::to_string(options.node_rank) + " with --nnodes " +
                                std::to_string(options.min_nodes) + ":" + std::to_string(options.nnodes) +
                                ": an elastic job's node ranks come from the rendezvous; leave --node-rank out");
  }
  if (options.node_rank >= options.nnodes) {
    throw std::invalid_argument("--node-rank " + std::to_string(options.node_rank) + " is not below --nnodes " +
                                std::to_string(options.nnodes));
  }
  if (options.nnodes > 1 && options.master_addr.empty() && options.min_nodes == 0) {
    throw std::invalid_argument("--master-addr is required with --nnodes " + std::to_string(options.nnodes) +
                                ": every node must reach rank 0's host");
  }
  return options;
}

}  // namespace shardtrain::launch
