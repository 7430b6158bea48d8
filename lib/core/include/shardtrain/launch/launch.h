// `shardtrain launch`: starts the workers of one node with torchrun's environment and supervises them.
//
// Intended usage:
//   1. parse_launch_args(argv) -> LaunchOptions (throws std::invalid_argument naming the bad option or value)
//   2. run_launch(options)     -> exit status for the launcher's process
//
// What the workers get, as torchrun gives it: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_ERROR_FILE, and TORCHELASTIC_USE_AGENT_STORE=True:
// the launcher (node 0's) serves the job's store on MASTER_PORT, bound on loopback unless --master-addr names
// another interface, a fresh one for each attempt; every worker is its client. So any program torchrun runs —
// PyTorch's init_process_group, FSDP2, a DeviceMesh — runs unchanged. OMP_NUM_THREADS=1 when unset and several
// workers share the node. Values the environment held for these are replaced, and the launcher says so.
//
// Supervision: every output line is prefixed "[rankN]: ". When a worker exits non-zero or dies by a signal, the
// others get SIGTERM, then SIGKILL after `stop_grace`, the launcher says which rank failed and how, and exits with
// that rank's code (128 + signal for a signal). SIGINT/SIGTERM/SIGHUP to the launcher reach every worker, which get
// `preempt_grace` to finish (a trainer saves a checkpoint) before SIGKILL; the launcher exits with the code they all
// exited with, else 128 + signal. A worker exiting with kPreemptedExitCode was preempted: the others get the same
// grace, and the job is not restarted. Workers run in their own process groups (their children are stopped with
// them) and die with the launcher even if it is killed (PR_SET_PDEATHSIG). `max_restarts` restarts the whole group
// after a failure. Every worker of every restart gets the same SHARDTRAIN_JOB_ID: --rdzv-id, else the launcher's
// SHARDTRAIN_JOB_ID or SLURM_JOB_ID, else (one node only) a random one; ranks whose ids differ refuse to rendezvous.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace shardtrain::launch {

// [Note: progress through the launcher] Workers write into the launcher's pipes, not to a terminal. When the
// launcher's stderr is a terminal it sets SHARDTRAIN_PROGRESS=relay for its workers; a worker may then write a
// status line (a progress bar) to stderr as one line starting with kStatusLineMarker ("" clears it), and the
// launcher draws it in place at the bottom of the terminal, below the other lines, which it prints above it.
inline constexpr char kStatusLineMarker = '\x1e';  // ASCII record separator
inline constexpr const char* kProgressEnv = "SHARDTRAIN_PROGRESS";

// What a worker exits with after it was asked to stop and saved its state (EX_TEMPFAIL: try again later).
inline constexpr int kPreemptedExitCode = 75;

// [Note: a smaller batch after an out-of-memory] What a worker exits with when the batch chosen for it
// (train.batch_size: auto) ran out of memory before its second step completed. Its error file names the batch to
// retry with (kRetryBatchKey in extraInfo); the launcher then restarts the whole group — not counted against
// max_restarts, at most kMaxBatchRetries times — with kAutoBatchLimitEnv set to the smallest batch any worker
// asked for. One node's launcher sees its own workers only: across nodes the other nodes' groups restart only
// within their max_restarts, and the restarted ranks plan with the smallest limit any of them was given (the
// trainer agrees on it before planning).
inline constexpr int kOutOfMemoryExitCode = 76;
inline constexpr const char* kRetryBatchKey = "retry_batch_size";
inline constexpr const char* kAutoBatchLimitEnv = "SHARDTRAIN_AUTO_BATCH_LIMIT";
inline constexpr int kMaxBatchRetries = 16;

struct LaunchOptions {
  int nproc_per_node = 1;   // workers on this node
  int nnodes = 1;           // nodes in the job (elastic: the most)
  int node_rank = 0;        // this node, 0..nnodes-1 (elastic: the rendezvous assigns it)
  // --nnodes MIN:MAX (torchrun's elastic syntax): the job runs on any number of nodes in [MIN, MAX], meeting at
  // --rdzv-endpoint (or --master-addr/--master-port) in rounds (launch/elastic_rendezvous.h): a node lost or added
  // ends the round, and the surviving launchers restart their workers at the new world size. 0: a static job.
  int min_nodes = 0;
  // --rdzv-conf last_call_timeout=S,join_timeout=S,keep_alive_interval=S,keep_alive_max_attempt=N: how long a
  // round that has MIN nodes waits for more, how long a launcher waits for a round to reach MIN, and how often each
  // node beats and how many beats missed make it lost.
  std::chrono::milliseconds last_call{30000}, join_timeout{600000}, keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  std::string master_addr;  // rank 0's host; empty = 127.0.0.1 (required when nnodes > 1)
  int master_port = 0;      // 0 = a free port on one node, 29500 across nodes
  std::string master_port_option = "--master-port";  // how the user set it, for errors (a config key)
  int max_restarts = 0;     // whole-group restarts after a failure
  std::string rdzv_id;      // the job's id, the same on every node (SHARDTRAIN_JOB_ID); empty: see run_launch
  // The GPUs the workers see, as CUDA_VISIBLE_DEVICES ("0,1": Accelerate's gpu_ids); empty or "all": the
  // environment's. Checked by gpu_ids_checked.
  std::string gpu_ids;
  std::chrono::milliseconds stop_grace{3000};  // SIGTERM -> SIGKILL delay when stopping workers after a failure
  // SIGTERM/SIGINT to the launcher -> SIGKILL of the workers: their time to save (Slurm's KillWait default).
  std::chrono::milliseconds preempt_grace{30000};
  std::vector<std::string> command;            // PROGRAM ARGS...
};

// Accepts `--opt value` and `--opt=value`, with '-' and '_' interchangeable in names:
//   torchrun: --nproc-per-node --nnodes (N or MIN:MAX) --node-rank --master-addr --master-port --max-restarts
//             --rdzv-endpoint HOST:PORT --rdzv-conf last_call_timeout=S,join_timeout=S,keep_alive_interval=S,
//             keep_alive_max_attempt=N
//   ours: --preempt-grace SECONDS; torchrun's --rdzv-id ID
//   Accelerate: --num-processes (total over all machines) --num-machines --machine-rank
//               --main-process-ip --main-process-port
// then `--` (optional) and the command. argv excludes "launch" itself.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// `ids` when it is "all" or device indices separated by commas ("0,1,3"); else std::invalid_argument naming
// `option` and the value.
std::string gpu_ids_checked(const std::string& option, const std::string& ids);

std::string launch_usage();

// Runs the job on this node; returns the launcher's exit status. Prints its own messages on stderr.
int run_launch(const LaunchOptions& options);

}  // namespace shardtrain::launch
