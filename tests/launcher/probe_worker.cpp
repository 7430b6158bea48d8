// A worker for the launcher tests that misbehaves on request. Every rank records its pid (and, in most modes, the
// pid of a `sleep` child it starts, to check that the launcher stops a worker's children too) in DIR, then:
//   ok          print a line on stdout and stderr, exit 0 (the child is left for the launcher to clean up)
//   exit3       rank TARGET exits with code 3; the others sleep until stopped
//   sigkill     rank TARGET kills itself with SIGKILL; the others sleep
//   hang        all join the rendezvous; rank TARGET then hangs, the others wait in a barrier that times out
//   ignore-term every rank ignores SIGTERM; rank TARGET exits 1, the others must be killed with SIGKILL
//   sleep       every rank sleeps until stopped
//   fail-first  rank TARGET exits 5 on the first attempt (TORCHELASTIC_RESTART_COUNT=0), all succeed after
//   oom         the out-of-memory protocol of a trainer with train.batch_size: auto (launch.h): the batch is
//               SHARDTRAIN_AUTO_BATCH_LIMIT, else 64; above 8 every rank records the batch to retry with, half of
//               it less its rank (the launcher takes the smallest); once all have, rank 0 exits 76 and the others
//               wait to be stopped. At 8 or less each prints it and exits 0
//   oom-always  every rank asks for a batch of 1 and exits 76, every time
//   env         print the launcher's variables, exit 0
//   partial     print a line without its newline, exit 0
//   allreduce   join the job's process group, all-reduce the ranks and print the sum (multi-node test)
//   elastic     join the job's process group and all-reduce the ranks every 50 ms; in the first rendezvous round
//               (TORCHELASTIC_RESTART_COUNT=0) until a collective fails (a node lost) or the launcher stops it, in
//               a later one 10 times, printing the round, world and sum, then exit 0
//   needs3      as elastic, but a world size that 3 does not divide is refused (exit 2: a layout that does not fit)
// usage: probe_worker DIR MODE [TARGET]
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <ATen/ATen.h>

#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/launch/error_file.h"
#include "shardtrain/launch/launch.h"

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void write_pid(const std::string& path, pid_t pid) {
  std::ofstream(path + ".tmp") << pid << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

extern "C" void on_term_save(int) {
  ::usleep(300 * 1000);  // the checkpoint
  ::_exit(75);
}

[[noreturn]] void sleep_forever() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: probe_worker DIR MODE [TARGET]\n";
    return 2;
  }
  const std::string dir = argv[1], mode = argv[2];
  const int target = argc > 3 ? std::atoi(argv[3]) : 1;
  const int rank = std::atoi(env_or("RANK", "0").c_str());
  const bool is_target = rank == target;

  if (mode == "env") {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                             "MASTER_PORT", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT",
                             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "SHARDTRAIN_JOB_ID",
                             "CUDA_VISIBLE_DEVICES"}) {
      std::cout << name << "=" << env_or(name, "<unset>") << "\n";
    }
    return 0;
  }
  if (mode == "allreduce") {
    using namespace shardtrain::dist;
    ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(30);
    DistEnv env = read_dist_env(process_env_lookup());
    ProcessGroup pg = ProcessGroup::init(env, options);
    at::Tensor t = at::full({1}, static_cast<double>(env.rank), at::kDouble);
    pg.world().all_reduce(t, ReduceOp::SUM).wait();
    std::cout << "rank " << env.rank << " of " << env.world_size << " on node " << env.node_rank << ": sum "
              << t.item<double>() << std::endl;
    return 0;
  }
  if (mode == "needs3" && std::atoi(env_or("WORLD_SIZE", "1").c_str()) % 3 != 0) {
    std::cerr << "tp_size 3 does not divide a world of " << env_or("WORLD_SIZE", "1") << std::endl;
    return 2;
  }
  if (mode == "elastic" || mode == "needs3") {
    using namespace shardtrain::dist;
    ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(20);
    const DistEnv env = read_dist_env(process_env_lookup());
    write_pid(dir + "/worker" + std::to_string(env.rank) + "-round" + std::to_string(env.restart_count) + ".pid",
              getpid());
    ProcessGroup pg = ProcessGroup::init(env, options);
    for (int i = 0; env.restart_count == 0 || i < 10; ++i) {
      at::Tensor t = at::full({1}, static_cast<double>(env.rank), at::kDouble);
      pg.world().all_reduce(t, ReduceOp::SUM).wait();  // throws when a peer is gone
      if (i == 0) {
        std::cout << "round " << env.restart_count << ": rank " << env.rank << " of " << env.world_size << " on node "
                  << env.node_rank << ": sum " << t.item<double>() << std::endl;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return 0;
  }
  if (mode == "partial") {
    std::cout << "no newline from rank " << rank << std::flush;
    return 0;
  }

  pid_t child = fork();
  if (child == 0) {
    execl("/bin/sleep", "sleep", "300", static_cast<char*>(nullptr));
    _exit(127);
  }
  write_pid(dir + "/grandchild" + std::to_string(rank) + ".pid", child);
  if (mode == "ignore-term") signal(SIGTERM, SIG_IGN);
  // A trainer being preempted: SIGTERM -> save (a pause) -> exit 75; the target ignores SIGTERM instead.
  if (mode == "save-on-term") signal(SIGTERM, is_target ? SIG_IGN : on_term_save);
  write_pid(dir + "/worker" + std::to_string(rank) + ".pid", getpid());
  std::cout << "hello from rank " << rank << std::endl;
  std::cerr << "stderr line from rank " << rank << std::endl;

  const auto pause = std::chrono::milliseconds(300);
  if (mode == "ok") return 0;
  if (mode == "sleep") sleep_forever();
  if (mode == "exit3" || mode == "sigkill" || mode == "ignore-term") {
    if (!is_target) sleep_forever();
    std::this_thread::sleep_for(pause);
    if (mode == "sigkill") raise(SIGKILL);
    return mode == "exit3" ? 3 : 1;
  }
  if (mode == "save-on-term") sleep_forever();
  if (mode == "exit75") {  // every rank preempted on its own, the target first: the others wait for its mark, as
                           // ranks started under load can be far apart (a fixed head start lost in CI once)
    const std::string mark = dir + "/preempted";
    if (is_target) {
      std::this_thread::sleep_for(pause);
      std::ofstream(mark) << rank;
      return 75;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::ifstream(mark) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(pause);
    return 75;
  }
  if (mode == "oom" || mode == "oom-always") {
    const int batch = std::atoi(env_or(shardtrain::launch::kAutoBatchLimitEnv, "64").c_str());
    if (mode == "oom" && batch <= 8) {
      std::cout << "batch " << batch << std::endl;
      return 0;
    }
    const int retry = mode == "oom" ? batch / 2 - rank : 1;
    shardtrain::launch::record_error("out of memory at batch " + std::to_string(batch),
                                     {{shardtrain::launch::kRetryBatchKey, std::to_string(retry)}});
    if (mode == "oom") {
      // Every rank records before rank 0 exits first, asking the most: the launcher stops the others (SIGTERM) and
      // must still find their smaller batches in their files.
      const std::string own = env_or("TORCHELASTIC_ERROR_FILE", "");
      const std::string prefix = own.substr(0, own.rfind("error-rank"));
      const int world = std::atoi(env_or("WORLD_SIZE", "1").c_str());
      for (int r = 0, waited = 0; r < world && waited < 500; ++r) {
        while (!std::ifstream(prefix + "error-rank" + std::to_string(r) + ".json") && waited++ < 500) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      if (rank != 0) sleep_forever();
    }
    return shardtrain::launch::kOutOfMemoryExitCode;
  }
  if (mode == "fail-first") {
    const bool first = env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0";
    if (first && is_target) return 5;
    return 0;
  }
  if (mode == "hang") {
    using namespace shardtrain::dist;
    ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(3);
    ProcessGroup pg = ProcessGroup::init(read_dist_env(process_env_lookup()), options);
    if (is_target) sleep_forever();
    try {
      pg.world().barrier().wait();
    } catch (const std::exception& e) {
      std::cerr << "barrier failed: " << e.what() << std::endl;
      return 1;
    }
    std::cerr << "barrier passed although rank " << target << " hangs" << std::endl;
    return 0;
  }
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}
