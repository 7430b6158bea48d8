#include "shardtrain/distributed/env.h"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::dist {
namespace {

// Parses a decimal integer, naming the variable and its value when it is not one.
int parse_int(const std::string& name, const std::string& value) {
  size_t used = 0;
  long parsed = 0;
  try {
    parsed = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || parsed < 0 || parsed > 1'000'000'000) {
    throw std::invalid_argument(name + "='" + value + "' is not a non-negative integer");
  }
  return static_cast<int>(parsed);
}

std::string require(const EnvLookup& lookup, const std::string& name, const std::string& why) {
  auto value = lookup(name);
  if (!value || value->empty()) {
    throw std::invalid_argument("environment variable " + name + " is not set (" + why + ")");
  }
  return *value;
}

int require_int(const EnvLookup& lookup, const std::string& name, const std::string& why) {
  return parse_int(name, require(lookup, name, why));
}

std::optional<int> optional_int(const EnvLookup& lookup, const std::string& name) {
  auto value = lookup(name);
  if (!value || value->empty()) return std::nullopt;
  return parse_int(name, *value);
}

// Checks 0 <= rank < size, naming both variables.
void check_below(const std::string& rank_name, int rank, const std::string& size_name, int size) {
  if (size < 1) throw std::invalid_argument(size_name + "=" + std::to_string(size) + " must be at least 1");
  if (rank >= size) {
    throw std::invalid_argument(rank_name + "=" + std::to_string(rank) + " is not below " + size_name + "=" +
                                std::to_string(size));
  }
}

void check_port(const std::string& name, int port) {
  if (port < 1 || port > 65535) {
    throw std::invalid_argument(name + "=" + std::to_string(port) + " is not a TCP port (1..65535)");
  }
}

DistEnv read_torchrun(const EnvLookup& lookup) {
  const std::string why = "torchrun-style launch: RANK is set";
  DistEnv env;
  env.source = EnvSource::TORCHRUN;
  env.rank = require_int(lookup, "RANK", why);
  env.world_size = require_int(lookup, "WORLD_SIZE", why);
  check_below("RANK", env.rank, "WORLD_SIZE", env.world_size);
  // A hand-made launch may set only RANK/WORLD_SIZE: treat it as one node.
  env.local_rank = optional_int(lookup, "LOCAL_RANK").value_or(env.rank);
  env.local_world_size = optional_int(lookup, "LOCAL_WORLD_SIZE").value_or(env.world_size);
  check_below("LOCAL_RANK", env.local_rank, "LOCAL_WORLD_SIZE", env.local_world_size);
  env.node_rank = optional_int(lookup, "GROUP_RANK").value_or(env.rank / env.local_world_size);
  if (env.world_size > 1) {
    env.master_addr = require(lookup, "MASTER_ADDR", "needed to rendezvous when WORLD_SIZE > 1");
    env.master_port = require_int(lookup, "MASTER_PORT", "needed to rendezvous when WORLD_SIZE > 1");
    check_port("MASTER_PORT", env.master_port);
  }
  env.restart_count = optional_int(lookup, "TORCHELASTIC_RESTART_COUNT").value_or(0);
  env.agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";  // torchrun's spelling
  env.elastic = lookup("SHARDTRAIN_ELASTIC").value_or("") == "1";
  return env;
}

DistEnv read_mpi(const EnvLookup& lookup) {
  const std::string why = "Open MPI launch: OMPI_COMM_WORLD_RANK is set";
  DistEnv env;
  env.source = EnvSource::MPI;
  env.rank = require_int(lookup, "OMPI_COMM_WORLD_RANK", why);
  env.world_size = require_int(lookup, "OMPI_COMM_WORLD_SIZE", why);
  check_below("OMPI_COMM_WORLD_RANK", env.rank, "OMPI_COMM_WORLD_SIZE", env.world_size);
  env.local_rank = require_int(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", why);
  env.local_world_size = require_int(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", why);
  check_below("OMPI_COMM_WORLD_LOCAL_RANK", env.local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE", env.local_world_size);
  env.node_rank = optional_int(lookup, "OMPI_COMM_WORLD_NODE_RANK").value_or(env.rank / env.local_world_size);
  // mpirun does not say where rank 0 runs. On one node it is this host; across nodes the user must say.
  if (auto addr = lookup("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
  } else if (env.local_world_size != env.world_size) {
    require(lookup, "MASTER_ADDR", "mpirun across several nodes: set it to rank 0's host");
  }
  env.master_port = optional_int(lookup, "MASTER_PORT").value_or(29500);
  check_port("MASTER_PORT", env.master_port);
  return env;
}

DistEnv read_slurm(const EnvLookup& lookup) {
  const std::string why = "Slurm srun launch: SLURM_PROCID is set";
  DistEnv env;
  env.source = EnvSource::SLURM;
  env.rank = require_int(lookup, "SLURM_PROCID", why);
  env.world_size = require_int(lookup, "SLURM_NTASKS", why);
  check_below("SLURM_PROCID", env.rank, "SLURM_NTASKS", env.world_size);
  env.local_rank = require_int(lookup, "SLURM_LOCALID", why);
  env.node_rank = optional_int(lookup, "SLURM_NODEID").value_or(0);
  std::string per_node;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (auto v = lookup(name); v && !v->empty()) {
      per_node = *v;
      break;
    }
  }
  env.local_world_size = per_node.empty() ? env.world_size : slurm_tasks_on_node(per_node, env.node_rank);
  check_below("SLURM_LOCALID", env.local_rank, "tasks on this node", env.local_world_size);
  if (auto addr = lookup("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
  } else {
    std::string nodes;
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto v = lookup(name); v && !v->empty()) {
        nodes = *v;
        break;
      }
    }
    if (nodes.empty()) {
      require(lookup, "MASTER_ADDR", "Slurm gave no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST to find rank 0's host");
    }
    env.master_addr = slurm_first_host(nodes);
  }
  // Every task of the step derives the same port from the job id, so concurrent jobs on a node do not collide.
  if (auto port = optional_int(lookup, "MASTER_PORT")) {
    env.master_port = *port;
  } else if (auto job = optional_int(lookup, "SLURM_JOB_ID")) {
    env.master_port = 15000 + *job % 20000;
  }
  check_port("MASTER_PORT", env.master_port);
  return env;
}

}  // namespace

const char* env_source_name(EnvSource source) {
  switch (source) {
    case EnvSource::NONE: return "none";
    case EnvSource::TORCHRUN: return "torchrun";
    case EnvSource::SLURM: return "slurm";
    case EnvSource::MPI: return "mpi";
  }
  return "?";
}

EnvLookup process_env_lookup() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

// The launcher's name for the job, the same in every restart of it: ours, torchrun's rendezvous id (its default
// "none" names nothing), or Slurm's job.
std::string job_id_of(const EnvLookup& lookup) {
  for (const char* name : {"SHARDTRAIN_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    const auto v = lookup(name);
    if (v && !v->empty() && *v != "none") return *v;
  }
  return "";
}

DistEnv read_dist_env(const EnvLookup& lookup) {
  auto is_set = [&](const char* name) {
    auto v = lookup(name);
    return v && !v->empty();
  };
  DistEnv env;
  if (is_set("RANK") || is_set("WORLD_SIZE")) {
    env = read_torchrun(lookup);
  } else if (is_set("OMPI_COMM_WORLD_RANK")) {
    env = read_mpi(lookup);
  } else if (is_set("SLURM_PROCID") && is_set("SLURM_STEP_ID")) {
    env = read_slurm(lookup);
  }
  env.job_id = job_id_of(lookup);
  return env;
}

std::string slurm_first_host(const std::string& nodelist) {
  // Grammar (subset Slurm prints): host[,host...], host = prefix or prefix[range,range...], range = a or a-b.
  size_t end = nodelist.find_first_of(",[");
  if (end == std::string::npos) return nodelist;
  std::string prefix = nodelist.substr(0, end);
  if (nodelist[end] == ',') return prefix;
  size_t close = nodelist.find(']', end);
  if (close == std::string::npos || prefix.empty()) {
    throw std::invalid_argument("Slurm node list '" + nodelist + "' is malformed: expected host or host[a-b,...]");
  }
  std::string first = nodelist.substr(end + 1, nodelist.find_first_of(",-]", end + 1) - end - 1);
  if (first.empty()) {
    throw std::invalid_argument("Slurm node list '" + nodelist + "' has an empty range");
  }
  return prefix + first;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index) {
  // "2(x3),1" : three nodes with two tasks, then one with one.
  int node = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    std::string item = tasks_per_node.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int repeat = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')') {
        throw std::invalid_argument("Slurm tasks-per-node '" + tasks_per_node + "' is malformed at '" + item + "'");
      }
      repeat = parse_int("SLURM_TASKS_PER_NODE repeat", item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    int tasks = parse_int("SLURM_TASKS_PER_NODE", item);
    if (node_index < node + repeat) return tasks;
    node += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  throw std::invalid_argument("SLURM_NODEID=" + std::to_string(node_index) + " is past the " + std::to_string(node) +
                              " nodes of tasks-per-node '" + tasks_per_node + "'");
}

}  // namespace shardtrain::dist
