// Faults an operator meets around a running job, injected for real through the CLI and the launcher (2 processes,
// CPU, flava-debug on synthetic data; docs/notes/reliability.md lists them):
//  - a diverging run (optim.lr 1e6): non-finite steps are skipped on every rank, then rolled back to the newest
//    verified checkpoint, then the run stops with its history; no checkpoint is saved after a non-finite step and
//    the good one is never pruned; on_nonfinite: stop and rollback act at once;
//  - a second run in a live run's checkpoint.dir, with and without --resume: refused naming the holder;
//  - a full disk during a save and during an export (a tmpfs; root): the OS's reason, no partial files, the
//    previous checkpoint still the newest that verifies;
//  - a resume under changed settings: listed and refused, allowed by key, never for the model;
//  - an explicit batch the memory model says cannot fit: refused before any worker starts, unless train.force;
//  - a stray RANK=0 WORLD_SIZE=1: launch.num_processes still starts its workers, and says why;
//  - a rendezvous port in use through the config: the error names the config key;
//  - a rank waiting for peers that never come: it says so while it waits, and names them when it gives up.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/io/files.h"
#include "support/free_port.h"
#include "support/scratch.h"
#include "train/train_harness.h"

namespace shardtrain {
namespace {

using test::Background;
using test::Outcome;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class FaultsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = "/tmp/shardtrain_faults_test_" + std::to_string(::getpid());
    const Outcome synth = test::write_flava_suite(root_);
    ASSERT_EQ(synth.status, 0) << synth.output;
  }
  static void TearDownTestSuite() { io::remove_tree(root_); }

  static std::string train(const std::string& overrides) {
    return std::string(SHARDTRAIN_BIN) + " train " + root_ + "/config.yaml --train.eval_interval=0 " + overrides;
  }
  static std::string launched(const std::string& overrides) {
    return std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 2 -- " + train(overrides);
  }

  static std::string root_;
};
std::string FaultsTest::root_;

// optim.lr 1e6 diverges from the second step, image-text batches only: a text-only batch after the first step's
// update can stay finite (its MLM head had no gradient in that step, and the encoder's output is normalised), by a
// margin that rounding decides. Under the default (skip): each non-finite step is skipped on both ranks, the sixth
// within the window rolls back to step 1, twice (train.max_rollbacks), then the run stops with the history. Every
// checkpoint after step 1 would have been after a non-finite step: none is saved, and step 1, the only good one, is
// kept although checkpoint.keep is 2 and the interval 1.
TEST_F(FaultsTest, ADivergingRunSkipsRollsBackAndStopsKeepingItsGoodCheckpoint) {
  const std::string dir = root_ + "/diverging";
  const std::string diverging = "--optim.lr=1e6 '--data.mix={image_text: 1.0, text: 0.0, image: 0.0}' ";
  const Outcome r = test::run(
      launched(diverging + "--train.steps=40 --checkpoint.interval=1 --checkpoint.keep=2 --checkpoint.dir=" + dir));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint " + dir + "/step-00000001")) << r.output;
  EXPECT_TRUE(contains(r.output, ": the update was skipped on every rank (1 skipped within 100 steps")) << r.output;
  EXPECT_TRUE(contains(r.output, "rolled back to " + dir + "/step-00000001 (rollback 1 of at most 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "rolled back to " + dir + "/step-00000001 (rollback 2 of at most 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "the run stops (after 2 rollback(s), the most train.max_rollbacks allows). Steps "
                                 "that were not finite: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "rolled back from step ")) << r.output;
  EXPECT_TRUE(contains(r.output, "root cause: rank ")) << r.output;
  EXPECT_FALSE(contains(r.output, "SIGABRT")) << r.output;
  EXPECT_EQ(ckpt::list_checkpoints(dir), std::vector<std::string>{dir + "/step-00000001"});
  const Outcome verify = test::run(std::string(SHARDTRAIN_BIN) + " checkpoint verify " + dir);
  EXPECT_EQ(verify.status, 0) << verify.output;

  // stop: at the first non-finite step, numbered as the log numbers steps; rollback: back at once.
  const Outcome stop = test::run(launched(diverging + "--train.steps=40 --train.on_nonfinite=stop"));
  EXPECT_EQ(stop.status, 1) << stop.output;
  EXPECT_TRUE(contains(stop.output, "the run stops (train.on_nonfinite: stop). Steps that were not finite: step "))
      << stop.output;
  EXPECT_FALSE(contains(stop.output, "step 0:")) << stop.output;
  const std::string back_dir = root_ + "/diverging-rollback";
  const Outcome back = test::run(launched(diverging + "--train.steps=40 --train.on_nonfinite=rollback "
                                          "--train.max_rollbacks=1 --checkpoint.interval=1 --checkpoint.dir=" +
                                          back_dir));
  EXPECT_EQ(back.status, 1) << back.output;
  EXPECT_TRUE(contains(back.output, "rolled back to " + back_dir + "/step-00000001 (rollback 1 of at most 1)"))
      << back.output;
  EXPECT_FALSE(contains(back.output, "the update was skipped")) << back.output;
  EXPECT_EQ(ckpt::list_checkpoints(back_dir), std::vector<std::string>{back_dir + "/step-00000001"});
}

// parallel.check_replicas_every: under DDP every data-parallel rank's parameters are compared with the others' every
// 2 steps, under tensor parallelism those it does not split with the group's, and a run whose replicas agree trains
// on (a flipped bit is named by Agreement.ReplicasNameTheRankWhoseParametersDiffer); under full_shard alone no rank
// holds another's parameters, which the start says; a negative interval is refused by name.
TEST_F(FaultsTest, ReplicasAreComparedEveryNSteps) {
  const Outcome ddp = test::run(launched("--parallel.strategy=ddp --parallel.check_replicas_every=2"));
  EXPECT_EQ(ddp.status, 0) << ddp.output;
  EXPECT_TRUE(contains(ddp.output, "replicas: every 2 steps this rank's parameters are compared with its replicas' "
                                   "(ranks 0, 1) (parallel.check_replicas_every)")) << ddp.output;
  // Tensor parallelism over 2: what it does not split, the group's ranks hold alike.
  const Outcome split = test::run(launched("--model.flavor=llama-debug --parallel.tp_size=2 "
                                           "--parallel.check_replicas_every=2"));
  EXPECT_EQ(split.status, 0) << split.output;
  EXPECT_TRUE(contains(split.output, "compared with its tensor-parallel group's where it does not split them (ranks "
                                     "0, 1)")) << split.output;
  const Outcome sharded = test::run(launched("--parallel.check_replicas_every=2"));
  EXPECT_EQ(sharded.status, 0) << sharded.output;
  EXPECT_TRUE(contains(sharded.output, "no other rank holds this rank's parameters under full_shard"))
      << sharded.output;
  const Outcome refused = test::run(train("--parallel.check_replicas_every=-1 --dry-run"));
  EXPECT_NE(refused.status, 0);
  EXPECT_TRUE(contains(refused.output, "parallel.check_replicas_every: -1 is not 0 (never) or a number of steps"))
      << refused.output;
}

// A checkpoint directory belongs to one live run: a second run is refused, with --resume or without, naming the
// first; once the first has ended (SIGTERM: it saves and exits 75) the second resumes it.
TEST_F(FaultsTest, ASecondRunInALiveRunsDirectoryIsRefused) {
  const std::string dir = root_ + "/shared-dir";
  const Background first(launched("--train.steps=100000 --checkpoint.interval=2 --checkpoint.dir=" + dir),
                         root_ + "/first.txt");
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (ckpt::list_checkpoints(dir).empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(ckpt::list_checkpoints(dir).empty()) << test::read_text(first.out);
  const std::string run_id = ckpt::run_id_of(ckpt::list_checkpoints(dir)[0]);
  for (const std::string resume : {"", " --resume"}) {
    const Outcome second = test::run(launched("--train.steps=4 --checkpoint.dir=" + dir + resume));
    EXPECT_EQ(second.status, 2) << second.output;
    EXPECT_TRUE(contains(second.output, "checkpoint.dir: '" + dir + "' belongs to a run that is still going (run " +
                                            run_id + ", host ")) << second.output;
  }
  ::kill(first.pid, SIGTERM);
  const Outcome ended = first.wait();
  EXPECT_EQ(ended.status, 75) << ended.output;
  const int64_t saved = ckpt::read_trainer_state(*ckpt::latest_checkpoint(dir)).step;
  const Outcome resumed =
      test::run(launched("--train.steps=100000 --train.stop_at=" + std::to_string(saved + 2) +
                         " --checkpoint.interval=2 --checkpoint.dir=" + dir + " --resume"));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from ")) << resumed.output;
  EXPECT_FALSE(contains(resumed.output, "was left by a run")) << resumed.output;  // the first released it
}

// A full disk (a 3 MB tmpfs, room for one checkpoint of about 2.2 MB): the second save fails on the ranks that
// write, every rank stops with the OS's reason and the file, nothing is left of the partial save, and the first
// checkpoint is still the newest and verifies. An export onto the full disk fails the same way.
TEST_F(FaultsTest, AFullDiskStopsTheRunWithTheReasonAndLeavesTheLastCheckpoint) {
  const std::string mnt = root_ + "/full";
  const testing::SmallDisk disk(mnt, "3m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  const std::string dir = mnt + "/ck";
  const Outcome r = test::run(launched("--train.steps=20 --checkpoint.interval=1 --checkpoint.keep=0 "
                                       "--checkpoint.dir=" + dir));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "the checkpoint of step 2 was not saved: rank ")) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot write '" + dir + "/step-00000002.partial/")) << r.output;
  EXPECT_TRUE(contains(r.output, "No space left on device")) << r.output;
  EXPECT_FALSE(contains(r.output, "SIGABRT")) << r.output;
  EXPECT_FALSE(contains(r.output, "recorded no error")) << r.output;
  EXPECT_EQ(ckpt::list_checkpoints(dir), std::vector<std::string>{dir + "/step-00000001"});
  EXPECT_FALSE(io::path_exists(dir + "/step-00000002.partial"));
  EXPECT_EQ(test::run(std::string(SHARDTRAIN_BIN) + " checkpoint verify " + dir).status, 0);

  const Outcome file = test::run(std::string(SHARDTRAIN_BIN) + " checkpoint export " + dir + " --out " + mnt +
                                 "/model.safetensors");
  EXPECT_EQ(file.status, 1) << file.output;
  EXPECT_TRUE(contains(file.output, "No space left on device")) << file.output;
  const Outcome hf = test::run(std::string(SHARDTRAIN_BIN) + " checkpoint export " + dir + " --hf " + mnt + "/hf");
  EXPECT_EQ(hf.status, 1) << hf.output;
  EXPECT_TRUE(contains(hf.output, "No space left on device")) << hf.output;
  EXPECT_EQ(io::list_directory(mnt), std::vector<std::string>{"ck"});  // no file or directory left of either
}

// checkpoint.async on a full disk (a 3 MB tmpfs, room for one checkpoint): step 2's save fails in the background on
// the ranks that write; the run stops at its next save (step 3) with the OS's reason and the file, the partial
// save removed, step 1's checkpoint still the newest and verified.
TEST_F(FaultsTest, AnAsyncSaveThatFailsStopsTheRunAtTheNextSave) {
  const std::string mnt = root_ + "/full-async";
  const testing::SmallDisk disk(mnt, "3m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  const std::string dir = mnt + "/ck";
  const Outcome r = test::run(launched("--train.steps=20 --checkpoint.interval=1 --checkpoint.keep=0 "
                                       "--checkpoint.async=true --checkpoint.dir=" + dir));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint " + dir + "/step-00000001 written (")) << r.output;
  EXPECT_TRUE(contains(r.output, "the checkpoint of step 2 was not saved: rank ")) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot write '" + dir + "/step-00000002.partial/")) << r.output;
  EXPECT_TRUE(contains(r.output, "No space left on device")) << r.output;
  EXPECT_TRUE(contains(r.output, "it was written in the background, and the run stops at step 3")) << r.output;
  EXPECT_FALSE(contains(r.output, "SIGABRT")) << r.output;
  EXPECT_EQ(ckpt::list_checkpoints(dir), std::vector<std::string>{dir + "/step-00000001"});
  EXPECT_FALSE(io::path_exists(dir + "/step-00000002.partial"));
  EXPECT_EQ(test::run(std::string(SHARDTRAIN_BIN) + " checkpoint verify " + dir).status, 0);
}

// checkpoint.async's staging buffer: what each save copies (rank 0's, said at each save) is what the memory model
// counts for it at start, within 10% — FULL_SHARD (each rank its shards) and DDP (rank 0 the whole model) — and the
// weights saved at the end are bitwise those of the synchronous run.
TEST_F(FaultsTest, AsyncSavesStageWhatTheMemoryModelCountsAndSaveTheSameWeights) {
  // "<what> 1.1 MiB" -> bytes, from the first line holding `what`.
  const auto mib_after = [](const std::string& text, const std::string& what) {
    const size_t at = text.find(what);
    if (at == std::string::npos) return -1.0;
    return std::atof(text.c_str() + at + what.size()) * 1024 * 1024;
  };
  for (const std::string strategy : {"full_shard", "ddp"}) {
    SCOPED_TRACE(strategy);
    const std::string sync_dir = root_ + "/sync-" + strategy, async_dir = root_ + "/async-" + strategy;
    const std::string common = "--train.steps=4 --checkpoint.interval=2 --parallel.strategy=" + strategy + " ";
    const Outcome sync = test::run(launched(common + "--checkpoint.dir=" + sync_dir));
    ASSERT_EQ(sync.status, 0) << sync.output;
    const Outcome r = test::run(launched(common + "--checkpoint.async=true --checkpoint.dir=" + async_dir));
    ASSERT_EQ(r.status, 0) << r.output;
    const double predicted = mib_after(r.output, "checkpoint.async's staging buffer ");
    const double staged = mib_after(r.output, "checkpoint " + async_dir + "/step-00000002: ");
    ASSERT_GT(predicted, 0) << r.output;
    ASSERT_GT(staged, 0) << r.output;
    EXPECT_NEAR(predicted / staged, 1.0, 0.1) << r.output;
    EXPECT_TRUE(contains(r.output, "checkpoint " + async_dir + "/step-00000004 written (")) << r.output;
    const bool sharded = strategy != "ddp";
    const auto a = test::saved_state(sync_dir + "/step-00000004", sharded);
    const auto b = test::saved_state(async_dir + "/step-00000004", sharded);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [name, t] : a) EXPECT_TRUE(t.equal(b.at(name))) << name;
  }
}

// Resume compares the checkpoint's config with the run's: the run's settings changed are listed and refused unless
// allowed (then logged), the model never; what does not change the run (log.interval) is only said.
TEST_F(FaultsTest, ResumeListsChangedSettingsAndRefusesUnallowedOnes) {
  const std::string dir = root_ + "/changed";
  const std::string base = "--train.steps=8 --checkpoint.interval=2 --checkpoint.dir=" + dir;
  ASSERT_EQ(test::run(launched(base + " --train.stop_at=4")).status, 0);
  const Outcome refused = test::run(launched(base + " --resume --optim.lr=1e-3 --train.seed=3"));
  EXPECT_EQ(refused.status, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "the checkpoint of step 4 was trained with another config; changed:"))
      << refused.output;
  EXPECT_TRUE(contains(refused.output, "optim.lr 0.002 -> 0.001 (changes the run: allow it with "
                                       "--checkpoint.allow_changes=[optim.lr])")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "train.seed 0 -> 3 (changes the run")) << refused.output;

  const Outcome model = test::run(launched(base + " --resume --checkpoint.allow_changes=[all] "
                                                  "'--model.overrides={unimodal_layers: 1}'"));
  EXPECT_EQ(model.status, 2) << model.output;
  EXPECT_TRUE(contains(model.output, "model.overrides {} -> {unimodal_layers: 1} (the model: the checkpoint's "
                                     "tensors are another model's)")) << model.output;

  const Outcome allowed = test::run(launched(base + " --resume --optim.lr=1e-3 --checkpoint.allow_changes=[optim] "
                                                    "--log.interval=1"));
  EXPECT_EQ(allowed.status, 0) << allowed.output;
  EXPECT_TRUE(contains(allowed.output, "resumed with changed settings (checkpoint.allow_changes): optim.lr 0.002 -> "
                                       "0.001")) << allowed.output;
  EXPECT_TRUE(contains(allowed.output, "changed since the checkpoint: train.stop_at 4 -> 0, log.interval 2 -> 1"))
      << allowed.output;
}

// An explicit batch whose predicted peak is above the budget: refused by `shardtrain train` before any worker
// starts, naming the prediction, the budget and the largest batch that fits; train.force starts it anyway.
TEST_F(FaultsTest, ABatchThatCannotFitIsRefusedBeforeWorkersStart) {
  const std::string over = "--launch.num_processes=2 --train.steps=2 --train.batch_size=16 --train.eval_samples=0 "
                           "--train.memory_budget=4MiB";
  const Outcome refused = test::run(train(over));
  EXPECT_EQ(refused.status, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "train.batch_size: 16 per rank is predicted to need ")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "above 4.0 MiB (train.memory_budget); the largest batch that fits is "))
      << refused.output;
  EXPECT_FALSE(contains(refused.output, "[rank")) << "workers started:\n" << refused.output;
  const Outcome forced = test::run(train(over + " --train.force=true"));
  EXPECT_EQ(forced.status, 0) << forced.output;
  EXPECT_TRUE(contains(forced.output, "on 2 ranks")) << forced.output;
  // checkpoint.async's staging buffers beyond the machine's available host memory (flava-10b under DDP: 120 GB a
  // rank, the device budget set out of the way): refused the same way, with the numbers.
  const Outcome staged = test::run(train("--launch.num_processes=2 --model.flavor=flava-10b --parallel.strategy=ddp "
                                         "--train.memory_budget=10000GiB --checkpoint.async=true --checkpoint.dir=" +
                                         root_ + "/async-too-big"));
  EXPECT_EQ(staged.status, 2) << staged.output;
  EXPECT_TRUE(contains(staged.output, "checkpoint.async: each rank's staging buffer needs ")) << staged.output;
  EXPECT_TRUE(contains(staged.output, "2 ranks on this machine: ")) << staged.output;
  EXPECT_TRUE(contains(staged.output, "it has available (MemAvailable)")) << staged.output;
  EXPECT_FALSE(contains(staged.output, "train.batch_size:")) << staged.output;
  EXPECT_FALSE(contains(staged.output, "[rank")) << "workers started:\n" << staged.output;
}

// RANK=0 WORLD_SIZE=1 left in the environment by hand do not turn launch.num_processes: 2 into one process.
TEST_F(FaultsTest, StrayRankVariablesDoNotOverrideTheConfigsProcesses) {
  const Outcome r = test::run("RANK=0 WORLD_SIZE=1 " + train("--launch.num_processes=2 --train.steps=2"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "RANK=0 WORLD_SIZE=1 in the environment were not set by a launcher")) << r.output;
  EXPECT_TRUE(contains(r.output, "the environment's RANK=0 WORLD_SIZE=1 are not this launcher's")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: training flava-debug (flava, 243,831 parameters) on 2 ranks")) << r.output;
}

// The rendezvous port in use, set through the config: the error names the config's key.
TEST_F(FaultsTest, APortInUseIsNamedByTheKeyThatSetIt) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  const Outcome r = test::run(train("--launch.num_processes=2 --train.steps=2 --launch.main_process_port=" +
                                    std::to_string(port)));
  ::close(fd);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Address already in use (choose another launch.main_process_port)")) << r.output;
}

// Node 0 of two started alone: its ranks say whom they wait for while they wait (every quarter of
// parallel.timeout here, every 30 s at most), then fail naming them.
TEST_F(FaultsTest, ARankWaitingForPeersSaysSo) {
  const int port = testing::free_loopback_port();
  const Outcome r = test::run(train("--launch.num_processes=4 --launch.num_machines=2 --launch.rdzv_id=alone "
                                    "--launch.main_process_ip=127.0.0.1 --launch.main_process_port=" +
                                    std::to_string(port) + " --parallel.timeout=8 --train.steps=2"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: rank 0: waiting at the rendezvous 127.0.0.1:")) << r.output;
  EXPECT_TRUE(contains(r.output, " for ranks 2, 3 (2 s of 8.0 s)")) << r.output;
  EXPECT_TRUE(contains(r.output, "ranks 2, 3 did not arrive within 8.0 s")) << r.output;
}

}  // namespace
}  // namespace shardtrain
