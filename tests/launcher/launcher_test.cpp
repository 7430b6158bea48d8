// `shardtrain launch` end to end: success, a rank exiting with code 3, a rank killed by SIGKILL, a rank that hangs,
// SIGTERM to the launcher, SIGKILL to the launcher, restarts, the environment, and output prefixes. Each test
// checks the exit status, the message naming the rank, and that no worker (or worker's child) is left running,
// by reading /proc for every pid the workers recorded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/free_port.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct LaunchResult {
  int exit_code = -1;  // shell convention: 128 + signal when the launcher itself was killed
  std::string out, err;
  double seconds = 0;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/shardtrain-launch-XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  void TearDown() override {
    // Whatever a failed test left behind must not outlive it.
    for (pid_t pid : recorded_pids()) ::kill(pid, SIGKILL);
    fs::remove_all(dir_);
  }

  // Runs `shardtrain launch ARGS -- probe_worker DIR MODE TARGET`. `during` runs while the launcher is running,
  // with its pid, e.g. to signal it.
  LaunchResult launch(std::vector<std::string> args, const std::string& mode, int target = 1,
                      const std::function<void(pid_t)>& during = {}) {
    std::vector<std::string> argv = {SHARDTRAIN_BIN, "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--", PROBE_WORKER_BIN, dir_.string(), mode, std::to_string(target)});
    const auto start = Clock::now();
    pid_t pid = spawn(argv, "");
    if (during) during(pid);
    LaunchResult r = finish(pid, "");
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  }

  // Starts a launcher with stdout/stderr in DIR/out<tag>.txt and DIR/err<tag>.txt.
  pid_t spawn(std::vector<std::string> argv, const std::string& tag) const {
    const std::string out_path = (dir_ / ("out" + tag + ".txt")).string();
    const std::string err_path = (dir_ / ("err" + tag + ".txt")).string();
    pid_t pid = fork();
    if (pid == 0) {
      int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    return pid;
  }

  LaunchResult finish(pid_t pid, const std::string& tag) const {
    int status = 0;
    ::waitpid(pid, &status, 0);
    LaunchResult r;
    r.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    r.out = read_file(dir_ / ("out" + tag + ".txt"));
    r.err = read_file(dir_ / ("err" + tag + ".txt"));
    return r;
  }

  std::vector<pid_t> recorded_pids() const {
    std::vector<pid_t> pids;
    if (!fs::exists(dir_)) return pids;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().extension() == ".pid") pids.push_back(std::atoi(read_file(entry.path()).c_str()));
    }
    return pids;
  }

  // Waits until `count` workers recorded their pids (they are running and have started their children).
  bool wait_for_workers(int count, std::chrono::seconds limit = std::chrono::seconds(30)) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      int n = 0;
      for (const auto& entry : fs::directory_iterator(dir_)) {
        n += entry.path().filename().string().rfind("worker", 0) == 0 && entry.path().extension() == ".pid";
      }
      if (n >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // A process is gone when /proc has no entry for it or it is a zombie (killed, not yet reaped by init).
  static bool alive(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    if (!stat) return false;
    std::string line;
    std::getline(stat, line);
    auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) return false;
    char state = line[close + 2];
    return state != 'Z' && state != 'X';
  }

  // Checks that every recorded pid is gone (allowing a moment for the kernel to deliver SIGKILL).
  void expect_nothing_left(const std::string& what) const {
    auto pids = recorded_pids();
    EXPECT_FALSE(pids.empty()) << what << ": the workers recorded no pids";
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    for (pid_t pid : pids) {
      while (alive(pid) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_FALSE(alive(pid)) << what << ": process " << pid << " outlived the launcher";
    }
  }

  fs::path dir_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(LauncherTest, SuccessPrefixesEveryLineWithItsRank) {
  auto r = launch({"--nproc-per-node", "3"}, "ok");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(r.out, "[rank" + std::to_string(rank) + "]: hello from rank " + std::to_string(rank) + "\n"))
        << r.out;
    EXPECT_TRUE(contains(r.err, "[rank" + std::to_string(rank) + "]: stderr line from rank " + std::to_string(rank)))
        << r.err;
  }
  expect_nothing_left("success");  // the `sleep` children the workers left behind are stopped too
}

TEST_F(LauncherTest, RankExitingWithCodeThreeStopsTheOthers) {
  auto r = launch({"--nproc-per-node", "3"}, "exit3", 1);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with code 3")) << r.err;
  EXPECT_LT(r.seconds, 15) << "the other ranks were not stopped within seconds";
  expect_nothing_left("exit 3");
}

TEST_F(LauncherTest, RankKilledBySigkill) {
  auto r = launch({"--nproc-per-node", "2"}, "sigkill", 0);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 9 (SIGKILL)")) << r.err;
  expect_nothing_left("SIGKILL");
}

TEST_F(LauncherTest, HangingRankIsBroughtDownByTheCollectiveTimeout) {
  // Rank 1 hangs after the rendezvous; rank 0's barrier times out (3 s), rank 0 fails, the launcher stops rank 1.
  auto r = launch({"--nproc-per-node", "2"}, "hang", 1);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "[rank0]: barrier failed: barrier on world (rank 0 of 2, gloo) failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with code 1")) << r.err;
  EXPECT_LT(r.seconds, 30);
  expect_nothing_left("hang");
}

TEST_F(LauncherTest, SigtermToTheLauncherReachesEveryWorker) {
  auto r = launch({"--nproc-per-node", "3"}, "sleep", 0, [&](pid_t launcher) {
    ASSERT_TRUE(wait_for_workers(3));
    ::kill(launcher, SIGTERM);
  });
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(contains(r.err, "received SIGTERM, passing it to 3 worker(s); SIGKILL in 30 s")) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(r.err, "stopped rank " + std::to_string(rank) + " (pid ")) << r.err;
  }
  EXPECT_TRUE(contains(r.err, "was killed by signal 15 (SIGTERM)")) << r.err;
  EXPECT_LT(r.seconds, 15);
  expect_nothing_left("SIGTERM");
}

TEST_F(LauncherTest, SigintToTheLauncher) {
  auto r = launch({"--nproc-per-node", "2"}, "sleep", 0, [&](pid_t launcher) {
    ASSERT_TRUE(wait_for_workers(2));
    ::kill(launcher, SIGINT);
  });
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  expect_nothing_left("SIGINT");
}

TEST_F(LauncherTest, WorkersIgnoringSigtermAreKilled) {
  // Rank 0 fails; ranks 1 and 2 ignore SIGTERM and are killed after the grace period.
  auto r = launch({"--nproc-per-node", "3"}, "ignore-term", 0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "stopped rank 2 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 9 (SIGKILL)")) << r.err;
  EXPECT_LT(r.seconds, 15);
  expect_nothing_left("ignore SIGTERM");
}

// Preemption: workers that save and exit 75 on SIGTERM make the launcher exit 75 (not 128 + 15).
TEST_F(LauncherTest, PreemptedWorkersSaveAndTheJobSaysSo) {
  auto r = launch({"--nproc-per-node", "2"}, "save-on-term", -1, [&](pid_t launcher) {
    ASSERT_TRUE(wait_for_workers(2));
    ::kill(launcher, SIGTERM);
  });
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with code 75")) << r.err;
  expect_nothing_left("preempted");
}

// One that ignores SIGTERM is killed after --preempt-grace.
TEST_F(LauncherTest, AWorkerThatDoesNotStopIsKilledAfterThePreemptGrace) {
  auto slow = launch({"--nproc-per-node", "2", "--preempt-grace", "1"}, "save-on-term", 1, [&](pid_t launcher) {
    ASSERT_TRUE(wait_for_workers(2));
    ::kill(launcher, SIGTERM);
  });
  EXPECT_EQ(slow.exit_code, 128 + SIGTERM) << slow.err;
  EXPECT_TRUE(contains(slow.err, "SIGKILL in 1 s")) << slow.err;
  EXPECT_TRUE(contains(slow.err, "stopped rank 1 (pid ")) << slow.err;
  EXPECT_TRUE(contains(slow.err, "was killed by signal 9 (SIGKILL)")) << slow.err;
  EXPECT_LT(slow.seconds, 10);
  expect_nothing_left("ignored preemption");
}

// A worker that exits 75 by itself was preempted: no restart, and the launcher exits 75.
TEST_F(LauncherTest, APreemptedWorkerIsNotRestarted) {
  auto r = launch({"--nproc-per-node", "2", "--max-restarts", "2"}, "exit75", 0);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 was preempted (exit 75)")) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
  expect_nothing_left("preempted worker");
}

TEST_F(LauncherTest, WorkersDieWithAKilledLauncher) {
  auto r = launch({"--nproc-per-node", "2"}, "sleep", 0, [&](pid_t launcher) {
    ASSERT_TRUE(wait_for_workers(2));
    ::kill(launcher, SIGKILL);
  });
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  // The workers themselves get SIGKILL from the kernel (PR_SET_PDEATHSIG). Their own children are theirs to
  // arrange; TearDown kills those.
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = std::atoi(read_file(dir_ / ("worker" + std::to_string(rank) + ".pid")).c_str());
    while (alive(pid) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(alive(pid)) << "worker " << rank << " outlived the killed launcher";
  }
}

TEST_F(LauncherTest, MaxRestartsRestartsTheWholeGroup) {
  auto r = launch({"--nproc-per-node", "2", "--max-restarts", "2"}, "fail-first", 1);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with code 5")) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting the worker group (restart 1 of 2)")) << r.err;
  expect_nothing_left("restart");
}

TEST_F(LauncherTest, WithoutRestartsTheFailureIsFinal) {
  auto r = launch({"--nproc-per-node", "2"}, "fail-first", 1);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_FALSE(contains(r.err, "restarting")) << r.err;
}

// [Note: a smaller batch after an out-of-memory] Workers that exit 76 with a batch in their error files restart
// the group with the smallest (64 -> 31 -> 14 -> 6: rank 1 asks one less than rank 0), not counted against
// --max-restarts; a job that keeps asking stops after kMaxBatchRetries with the workers' code.
TEST_F(LauncherTest, OutOfMemoryRestartsTheGroupWithTheSmallestBatchAsked) {
  auto r = launch({"--nproc-per-node", "2"}, "oom");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* limit : {"at most 31 per rank", "at most 14 per rank", "at most 6 per rank"}) {
    EXPECT_TRUE(contains(r.err, std::string("restarting the worker group with train.batch_size auto ") + limit))
        << r.err;
  }
  EXPECT_TRUE(contains(r.err, "(retry 3 of 16)")) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank0]: batch 6\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank1]: batch 6\n")) << r.out;

  auto always = launch({"--nproc-per-node", "2"}, "oom-always");
  EXPECT_EQ(always.exit_code, 76) << always.err;
  EXPECT_TRUE(contains(always.err, "(retry 16 of 16)")) << always.err;
  EXPECT_FALSE(contains(always.err, "(retry 17 of")) << always.err;
  EXPECT_TRUE(contains(always.err, "giving up on smaller batches after 16 restarts")) << always.err;
}

TEST_F(LauncherTest, WorkersGetTorchrunEnvironment) {
  auto r = launch({"--num_processes", "2", "--main_process_port", "0"}, "env");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank" + std::to_string(rank) + "]: ";
    EXPECT_TRUE(contains(r.out, p + "RANK=" + std::to_string(rank) + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "LOCAL_RANK=" + std::to_string(rank) + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "WORLD_SIZE=2\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "LOCAL_WORLD_SIZE=2\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "MASTER_ADDR=127.0.0.1\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "TORCHELASTIC_RESTART_COUNT=0\n")) << r.out;
  }
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    EXPECT_TRUE(contains(r.out, "[rank0]: OMP_NUM_THREADS=1\n")) << r.out;
  }
  // The launcher serves the store; every worker is its client, as under torchrun.
  EXPECT_TRUE(contains(r.out, "[rank0]: TORCHELASTIC_USE_AGENT_STORE=True\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank1]: TORCHELASTIC_USE_AGENT_STORE=True\n")) << r.out;
  // One job id for every worker: 16 hex digits, also torchrun's run id.
  const size_t at = r.out.find("[rank0]: SHARDTRAIN_JOB_ID=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string id = r.out.substr(at + 27, 16);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  EXPECT_TRUE(contains(r.out, "[rank1]: SHARDTRAIN_JOB_ID=" + id + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank1]: TORCHELASTIC_RUN_ID=" + id + "\n")) << r.out;
  EXPECT_FALSE(contains(r.out, "MASTER_PORT=0\n")) << "a free port must have been chosen: " << r.out;
  // Accelerate's --gpu_ids: the GPUs the workers see.
  r = launch({"--nproc-per-node", "2", "--gpu_ids", "1,3"}, "env");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank0]: CUDA_VISIBLE_DEVICES=1,3\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank1]: CUDA_VISIBLE_DEVICES=1,3\n")) << r.out;
}

TEST_F(LauncherTest, TwoNodesOnOneMachine) {
  // Two launchers, one per "node", rendezvous at 127.0.0.1 on a port node 0's launcher binds and serves (the
  // multi-node path), forming one world of 4.
  const int port = shardtrain::testing::free_loopback_port();
  std::vector<pid_t> launchers;
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(spawn({SHARDTRAIN_BIN, "launch", "--nnodes", "2", "--node-rank", std::to_string(node),
                               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                               std::to_string(port), "--rdzv-id", "two-nodes", "--", PROBE_WORKER_BIN, dir_.string(),
                               "allreduce"},
                              std::to_string(node)));
  }
  for (int node = 0; node < 2; ++node) {
    LaunchResult r = finish(launchers[node], std::to_string(node));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (int local = 0; local < 2; ++local) {
      const int rank = node * 2 + local;
      EXPECT_TRUE(contains(r.out, "[rank" + std::to_string(rank) + "]: rank " + std::to_string(rank) +
                                      " of 4 on node " + std::to_string(node) + ": sum 6\n"))
          << r.out << r.err;
    }
  }
}

// Elastic launchers (--nnodes 2:3) as three "nodes" on one machine: `elastic_node` starts one; `started` counts the
// workers that recorded a pid in round `round`; `serving` waits until the first says it serves the store.
class ElasticLauncherTest : public LauncherTest {
 protected:
  pid_t elastic_node(int port, const std::string& job, int index, const std::string& mode = "elastic") const {
    return spawn({SHARDTRAIN_BIN, "launch", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-endpoint",
                  "127.0.0.1:" + std::to_string(port), "--rdzv-id", job, "--rdzv-conf",
                  "last_call_timeout=1,join_timeout=60,keep_alive_interval=0.5,keep_alive_max_attempt=6",
                  "--max-restarts", "2", "--", PROBE_WORKER_BIN, dir_.string(), mode},
                 std::to_string(index));
  }
  int started(int round) const {
    int n = 0;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      n += name.rfind("worker", 0) == 0 && contains(name, "-round" + std::to_string(round) + ".pid");
    }
    return n;
  }
  bool wait_until(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(60)) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  bool serving(const std::string& tag) const {
    return wait_until([&] { return contains(read_file(dir_ / ("err" + tag + ".txt")), "(served here)"); });
  }
};

// Three nodes; one launcher killed with its worker while they all-reduce: the other two's collectives fail, they
// meet again in round 1 — after the last call, as two — and finish there, ranks 0 and 1 of 2.
TEST_F(ElasticLauncherTest, TheJobGoesOnWithoutALostNode) {
  const int port = shardtrain::testing::free_loopback_port();
  std::vector<pid_t> nodes = {elastic_node(port, "shrink", 0)};
  ASSERT_TRUE(serving("0")) << read_file(dir_ / "err0.txt");
  for (int i = 1; i < 3; ++i) nodes.push_back(elastic_node(port, "shrink", i));
  ASSERT_TRUE(wait_until([&] { return started(0) == 3; })) << read_file(dir_ / "err0.txt");
  ASSERT_EQ(::kill(nodes[2], SIGKILL), 0);
  finish(nodes[2], "2");
  for (int i = 0; i < 2; ++i) {
    const LaunchResult r = finish(nodes[i], std::to_string(i));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "rendezvous round 0: node ")) << r.err;
    EXPECT_TRUE(contains(r.err, " of 3, ranks ")) << r.err;
    EXPECT_TRUE(contains(r.err, "rendezvous round 1: node ")) << r.err;
    EXPECT_TRUE(contains(r.err, " of 2, ranks ")) << r.err;
    EXPECT_TRUE(contains(r.out, "round 1: rank ")) << r.out;
    EXPECT_TRUE(contains(r.out, " of 2 on node ")) << r.out;
    EXPECT_TRUE(contains(r.out, ": sum 1\n")) << r.out;
  }
}

// A program whose layout needs a world divisible by 3 (a tensor-parallel size of 3): after a node is lost it refuses
// the world of 2 (exit 2), and the job ends with that reason instead of meeting again.
TEST_F(ElasticLauncherTest, AWorldTheLayoutCannotHoldEndsTheJob) {
  const int port = shardtrain::testing::free_loopback_port();
  std::vector<pid_t> nodes = {elastic_node(port, "layout", 0, "needs3")};
  ASSERT_TRUE(serving("0")) << read_file(dir_ / "err0.txt");
  for (int i = 1; i < 3; ++i) nodes.push_back(elastic_node(port, "layout", i, "needs3"));
  ASSERT_TRUE(wait_until([&] { return started(0) == 3; })) << read_file(dir_ / "err0.txt");
  ASSERT_EQ(::kill(nodes[2], SIGKILL), 0);
  finish(nodes[2], "2");
  // The first node whose worker refuses ends the job; the other ends with it (its own worker may not have got as
  // far as refusing).
  std::string both;
  for (int i = 0; i < 2; ++i) {
    const LaunchResult r = finish(nodes[i], std::to_string(i));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "(exit 2: its input refused at 2 ranks), which another round would not change") ||
                contains(r.err, "the job ended on another node: node ")) << r.err;
    EXPECT_FALSE(contains(r.err, "rendezvous round 2:")) << r.err;
    both += r.err;
  }
  EXPECT_TRUE(contains(both, "tp_size 3 does not divide a world of 2")) << both;
}

// Two nodes train as round 0; a third launcher arrives: the two stop their workers, and round 1 runs on three.
TEST_F(ElasticLauncherTest, TheJobGrowsWhenANodeJoins) {
  const int port = shardtrain::testing::free_loopback_port();
  std::vector<pid_t> nodes = {elastic_node(port, "grow", 0)};
  ASSERT_TRUE(serving("0")) << read_file(dir_ / "err0.txt");
  nodes.push_back(elastic_node(port, "grow", 1));
  ASSERT_TRUE(wait_until([&] { return started(0) == 2; })) << read_file(dir_ / "err0.txt");
  nodes.push_back(elastic_node(port, "grow", 2));
  for (int i = 0; i < 3; ++i) {
    const LaunchResult r = finish(nodes[i], std::to_string(i));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.out, "round 1: rank ")) << r.out << r.err;
    EXPECT_TRUE(contains(r.out, " of 3 on node ")) << r.out;
    EXPECT_TRUE(contains(r.out, ": sum 3\n")) << r.out;
    if (i < 2) {
      EXPECT_TRUE(contains(r.err, "the rendezvous round ended (a node joined rendezvous round 1)")) << r.err;
    }
  }
}

// A worker of another job (another --rdzv-id) that reaches this job's rendezvous is refused by name; several nodes
// without an id are refused before starting.
TEST_F(LauncherTest, AnotherJobsWorkersCannotJoin) {
  const int port = shardtrain::testing::free_loopback_port();
  auto node = [&](int rank, const std::string& id) {
    return spawn({SHARDTRAIN_BIN, "launch", "--nnodes", "2", "--node-rank", std::to_string(rank), "--nproc-per-node",
                  "1", "--master-addr", "127.0.0.1", "--master-port", std::to_string(port), "--rdzv-id", id, "--",
                  PROBE_WORKER_BIN, dir_.string(), "allreduce"},
                 std::to_string(rank));
  };
  const pid_t ours = node(0, "job-a");
  const LaunchResult intruder = finish(node(1, "job-b"), "1");
  EXPECT_NE(intruder.exit_code, 0);
  EXPECT_TRUE(contains(intruder.err, "rank 1 is of job 'job-b' (SHARDTRAIN_JOB_ID, --rdzv-id), but the rendezvous at "
                                     "127.0.0.1:" + std::to_string(port) + " is job 'job-a''s")) << intruder.err;
  ::kill(ours, SIGTERM);
  finish(ours, "0");

  std::string command = std::string("'") + SHARDTRAIN_BIN + "' launch --nnodes 2 --node-rank 1 --master-addr " +
                        "127.0.0.1 -- true 2>" + (dir_ / "err.txt").string();
  const int status = std::system(("env -u SLURM_JOB_ID -u SHARDTRAIN_JOB_ID " + command).c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_TRUE(contains(read_file(dir_ / "err.txt"), "--nnodes 2 needs --rdzv-id ID")) << read_file(dir_ / "err.txt");
}

// Variables of the launcher's that the environment already holds (a stray RANK=0 WORLD_SIZE=1) are replaced for
// the workers, and the launcher says so.
TEST_F(LauncherTest, StrayLauncherVariablesAreReplacedAndSaid) {
  const std::string command = "RANK=0 WORLD_SIZE=1 '" + std::string(SHARDTRAIN_BIN) +
                              "' launch --nproc-per-node 2 -- '" + PROBE_WORKER_BIN + "' " + dir_.string() + " env >" +
                              (dir_ / "out.txt").string() + " 2>" + (dir_ / "err.txt").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir_ / "err.txt");
  const std::string out = read_file(dir_ / "out.txt"), err = read_file(dir_ / "err.txt");
  EXPECT_TRUE(contains(err, "the environment's RANK=0 WORLD_SIZE=1 are not this launcher's: its workers get their "
                            "own")) << err;
  EXPECT_TRUE(contains(out, "[rank1]: RANK=1\n")) << out;
  EXPECT_TRUE(contains(out, "[rank1]: WORLD_SIZE=2\n")) << out;
}

// What torchrun runs runs unchanged: tests/launcher/torch_program.py at world sizes 1-4, each rank running three
// programs in turn in one process group (one Python start a rank: each imports torch for seconds) and printing
// "ok rank R: MODE ..." for each:
//   allreduce  PyTorch's own init_process_group("gloo") from the environment: the launcher's store
//              (TORCHELASTIC_USE_AGENT_STORE);
//   fsdp2      FSDP2's fully_shard, three steps equal to one process's;
//   mesh       a DeviceMesh, 2-D (2 x 2) at 4 ranks.
TEST_F(LauncherTest, PyTorchProgramsRunAsUnderTorchrun) {
  const std::vector<std::string> modes = {"allreduce", "fsdp2", "mesh"};
  for (int world = 1; world <= 4; ++world) {
    const std::string command = "'" + std::string(SHARDTRAIN_BIN) + "' launch --nproc-per-node " +
                                std::to_string(world) + " -- '" + SHARDTRAIN_PYTHON + "' '" + TORCH_PROGRAM +
                                "' allreduce,fsdp2,mesh >" + (dir_ / "out.txt").string() + " 2>" +
                                (dir_ / "err.txt").string();
    const int status = std::system(command.c_str());
    const std::string out = read_file(dir_ / "out.txt"), err = read_file(dir_ / "err.txt");
    EXPECT_EQ(WEXITSTATUS(status), 0) << "world " << world << ":\n" << out << err;
    for (const std::string& mode : modes) {
      for (int rank = 0; rank < world; ++rank) {
        EXPECT_TRUE(contains(out, "[rank" + std::to_string(rank) + "]: ok rank " + std::to_string(rank) + ": " + mode))
            << mode << " at world " << world << ":\n" << out << err;
      }
    }
  }
}

// A PyTorch program whose rank fails in the first attempt runs to the end in the second: a fresh store for the
// restarted group (no key of the failed attempt's), as torchrun gives one.
TEST_F(LauncherTest, APyTorchProgramIsRestartedWithAFreshStore) {
  const std::string command = "'" + std::string(SHARDTRAIN_BIN) + "' launch --nproc-per-node 3 --max-restarts 1 -- '" +
                              SHARDTRAIN_PYTHON + "' '" + TORCH_PROGRAM + "' fail_once >" +
                              (dir_ / "out.txt").string() + " 2>" + (dir_ / "err.txt").string();
  const int status = std::system(command.c_str());
  const std::string out = read_file(dir_ / "out.txt"), err = read_file(dir_ / "err.txt");
  ASSERT_EQ(WEXITSTATUS(status), 0) << out << err;
  EXPECT_TRUE(contains(err, "root cause: rank 2 exited with code 3")) << err;
  EXPECT_TRUE(contains(err, "restarting the worker group (restart 1 of 1)")) << err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(out, "ok rank " + std::to_string(rank) + ": allreduce sum 6 over 3 ranks in attempt 1"))
        << out;
  }
}

TEST_F(LauncherTest, LastLineWithoutNewlineIsStillPrefixed) {
  auto r = launch({"--nproc-per-node", "2"}, "partial");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.out, "[rank0]: no newline from rank 0\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank1]: no newline from rank 1\n")) << r.out;
}

TEST_F(LauncherTest, ProgramThatCannotRunExits127) {
  std::vector<std::string> argv = {SHARDTRAIN_BIN, "launch", "--nproc-per-node", "2", "--",
                                   (dir_ / "no-such-program").string()};
  std::string command;
  for (auto& a : argv) command += "'" + a + "' ";
  command += "2>" + (dir_ / "err.txt").string();
  int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 127);
  EXPECT_TRUE(contains(read_file(dir_ / "err.txt"), "cannot execute")) << read_file(dir_ / "err.txt");
}

TEST_F(LauncherTest, BadOptionExits2WithTheReason) {
  std::string command = std::string("'") + SHARDTRAIN_BIN + "' launch --nproc-per-node zero -- true 2>" +
                        (dir_ / "err.txt").string();
  int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_TRUE(contains(read_file(dir_ / "err.txt"), "--nproc-per-node 'zero' is not an integer >= 1"));
}

// More workers than the machine can run, or than the open-file limit allows: refused before anything starts.
TEST_F(LauncherTest, NodeCapacityIsCheckedBeforeStarting) {
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::string command = std::string("'") + SHARDTRAIN_BIN + "' launch --nproc-per-node " + std::to_string(8 * cores + 1) +
                        " -- true 2>" + (dir_ / "err.txt").string();
  int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_TRUE(contains(read_file(dir_ / "err.txt"), "workers per core on this machine (" + std::to_string(cores) +
                                                        " cores online)")) << read_file(dir_ / "err.txt");
  // 4 nodes x 2 workers under an open-file limit of 24: each worker would hold about 3 x 8 + 64 files.
  command = "ulimit -n 24; '" + std::string(SHARDTRAIN_BIN) + "' launch --nnodes 4 --node-rank 0 --master-addr " +
            "127.0.0.1 --nproc-per-node 2 -- true 2>" + (dir_ / "err.txt").string();
  status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_TRUE(contains(read_file(dir_ / "err.txt"), "above the open-file limit 24 (raise it with ulimit -n)"))
      << read_file(dir_ / "err.txt");
}

}  // namespace
