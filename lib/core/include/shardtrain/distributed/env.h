// The job's place in the world: rank, world size, local rank and where to rendezvous, read from the variables
// that torchrun (and `shardtrain launch`), Slurm's srun or Open MPI's mpirun set. With none of them set the job is
// a single process (rank 0 of 1) that needs no network.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace shardtrain::dist {

// Which launcher's variables the environment was read from.
enum class EnvSource {
  NONE,      // nothing set: world size 1
  TORCHRUN,  // RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  SLURM,     // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE
  MPI,       // OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
};

const char* env_source_name(EnvSource source);

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;                       // rank / local_world_size when every node runs the same count
  std::string master_addr = "127.0.0.1";  // host of the TCPStore server (rank 0)
  int master_port = 29500;
  int restart_count = 0;                   // how many times the launcher restarted the group (TORCHELASTIC_RESTART_COUNT)
  // The launcher serves the job's store at MASTER_ADDR:MASTER_PORT and every rank is its client
  // (TORCHELASTIC_USE_AGENT_STORE=True: `shardtrain launch`, torchrun); else rank 0 serves it (mpirun, srun, a
  // hand-made launch).
  bool agent_store = false;
  // The launcher's id of the job, the same across its restarts: SHARDTRAIN_JOB_ID (`shardtrain launch`), else
  // TORCHELASTIC_RUN_ID (torchrun's --rdzv-id; "none" ignored), else SLURM_JOB_ID; "" without one.
  std::string job_id;
  // An elastic launch (`shardtrain launch --nnodes MIN:MAX`: SHARDTRAIN_ELASTIC): the world size may differ from one
  // restart to the next.
  bool elastic = false;
  EnvSource source = EnvSource::NONE;

  bool is_distributed() const { return world_size > 1; }
};

// Looks a variable up; returns nullopt when unset. Tests pass a map; programs pass process_env_lookup().
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env_lookup();

// Reads the environment. Precedence: torchrun's RANK/WORLD_SIZE, then Open MPI, then Slurm (srun), else world 1.
// Throws std::invalid_argument naming the variable when one is missing, not an integer or out of range
// (e.g. "RANK=4 is not below WORLD_SIZE=4").
DistEnv read_dist_env(const EnvLookup& lookup);

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03". Throws on a malformed list.
std::string slurm_first_host(const std::string& nodelist);

// Tasks on the node of `node_index` from a Slurm per-node list such as "2(x3),1": node 0..2 -> 2, node 3 -> 1.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index);

}  // namespace shardtrain::dist
