// What keeps a run's checkpoints whole, in one process: train.on_nonfinite's decisions, a checkpoint that refuses
// non-finite state and never replaces another run's, a failed write that leaves nothing behind, non-finite values
// found as damage, the checkpoint directory's lock, and what a resume may change.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <cstdlib>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/config/config.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/log/log.h"
#include "train/checkpoint_lock.h"
#include "train/nonfinite_policy.h"
#include "train/resume_check.h"
#include "support/scratch.h"

namespace shardtrain::train {
namespace {

using Action = NonFinitePolicy::Action;

config::TrainConfig policy_config(config::NonFinite mode, int64_t max_skipped, int64_t window, int64_t rollbacks) {
  config::TrainConfig t;
  t.on_nonfinite = mode, t.max_skipped_steps = max_skipped, t.skip_window = window, t.max_rollbacks = rollbacks;
  return t;
}

// skip: up to max_skipped_steps within skip_window steps are skipped; one more rolls back, while rollbacks are
// left; then the run stops, its history naming every event.
TEST(NonFinitePolicy, SkipsWithinTheWindowThenRollsBackThenStops) {
  NonFinitePolicy p(policy_config(config::NonFinite::SKIP, 2, 10, 1));
  EXPECT_EQ(p.on_nonfinite(3, "non-finite loss on rank 1"), Action::SKIP);
  EXPECT_EQ(p.on_nonfinite(5, "grad_norm inf"), Action::SKIP);
  EXPECT_EQ(p.skipped_in_window(), 2);
  // Step 14's window is steps 5-14: step 3 has left it, so this is the second in it, not the third.
  EXPECT_EQ(p.on_nonfinite(14, "grad_norm nan"), Action::SKIP);
  EXPECT_EQ(p.skipped_in_window(), 2);
  EXPECT_EQ(p.on_nonfinite(15, "grad_norm nan"), Action::SKIP);  // steps 6-15: 14 and 15
  EXPECT_EQ(p.on_nonfinite(16, "grad_norm nan"), Action::ROLLBACK);  // 14, 15, 16: one more than 2
  p.rolled_back(16, 10);
  EXPECT_EQ(p.skipped_in_window(), 0);  // the window starts afresh from the checkpoint
  EXPECT_EQ(p.on_nonfinite(11, "grad_norm nan"), Action::SKIP);
  EXPECT_EQ(p.on_nonfinite(12, "grad_norm nan"), Action::SKIP);
  EXPECT_EQ(p.on_nonfinite(13, "grad_norm nan"), Action::STOP);  // no rollback left
  EXPECT_EQ(p.history(), "step 3: non-finite loss on rank 1; step 5: grad_norm inf; step 14: grad_norm nan; "
                         "step 15: grad_norm nan; step 16: grad_norm nan; rolled back from step 16 to step 10; "
                         "step 11: grad_norm nan; step 12: grad_norm nan; step 13: grad_norm nan");
}

TEST(NonFinitePolicy, StopAndRollbackActAtTheFirstStep) {
  NonFinitePolicy stop(policy_config(config::NonFinite::STOP, 5, 100, 2));
  EXPECT_EQ(stop.on_nonfinite(1, "grad_norm nan"), Action::STOP);
  NonFinitePolicy back(policy_config(config::NonFinite::ROLLBACK, 5, 100, 1));
  EXPECT_EQ(back.on_nonfinite(7, "grad_norm nan"), Action::ROLLBACK);
  back.rolled_back(7, 4);
  EXPECT_EQ(back.on_nonfinite(6, "grad_norm nan"), Action::STOP);
  // Weights that are themselves not finite cannot be skipped past: a rollback at once, even under skip.
  NonFinitePolicy skip(policy_config(config::NonFinite::SKIP, 5, 100, 1));
  EXPECT_EQ(skip.on_nonfinite_weights(9, "'w' holds 3 NaN or Inf values of 6"), Action::ROLLBACK);
  skip.rolled_back(9, 8);
  EXPECT_EQ(skip.on_nonfinite_weights(9, "'w' holds 3 NaN or Inf values of 6"), Action::STOP);
}

TEST(NonFinitePolicy, TheHistoryKeepsTheLatestEvents) {
  NonFinitePolicy p(policy_config(config::NonFinite::SKIP, 1000, 1000, 0));
  for (int64_t step = 1; step <= 30; ++step) p.on_nonfinite(step, "grad_norm nan");
  const std::string h = p.history();
  EXPECT_EQ(h.rfind("(6 earlier); step 7: grad_norm nan; ", 0), 0u) << h;
  EXPECT_NE(h.find("step 30: grad_norm nan"), std::string::npos) << h;
}

// A linear layer and its AdamW, as a checkpoint sees them (one process, replicated).
struct LinearRun {
  std::shared_ptr<torch::nn::LinearImpl> linear;
  torch::optim::AdamW optimizer;
  dist::ProcessGroup pg;
  ckpt::CheckpointModel model;

  explicit LinearRun(int64_t width = 3)
      : linear(std::make_shared<torch::nn::LinearImpl>(width, 2)),
        optimizer(linear->parameters(), torch::optim::AdamWOptions(1e-3)),
        pg(dist::ProcessGroup::init(dist::DistEnv{})),
        model{linear, &optimizer, /*sharded=*/false, {}} {
    linear->forward(at::ones({1, width})).sum().backward();
    optimizer.step();  // AdamW's moments exist
  }
  std::string save(const std::string& dir, int64_t step, const std::string& run_id) {
    ckpt::TrainerState state;
    state.step = step, state.flavor = "linear", state.run_id = run_id;
    return ckpt::save_checkpoint(dir, state, model, pg.world());
  }
};

std::string temp_dir(const std::string& name) {
  const std::string dir = "/tmp/shardtrain_" + name + "_" + std::to_string(::getpid());
  io::remove_tree(dir);
  return dir;
}

// A diverged model is not saved: the save throws before writing anything, naming the tensor.
TEST(CheckpointSaves, NeverHoldNonFiniteValues) {
  const std::string dir = temp_dir("ckpt_nonfinite");
  LinearRun run;
  {
    at::NoGradGuard no_grad;
    run.linear->weight[0][1] = NAN;
  }
  try {
    run.save(dir, 4, "run");
    FAIL() << "saved NaN weights";
  } catch (const ckpt::NonFiniteState& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: 'weight' holds 1 NaN or Inf values of 6"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(ckpt::list_checkpoints(dir).empty());
  EXPECT_FALSE(io::path_exists(dir + "/step-00000004.partial"));
  io::remove_tree(dir);
}

// A save never replaces a checkpoint of the same step that another run wrote; its own it may.
TEST(CheckpointSaves, NeverReplaceAnotherRunsCheckpoint) {
  const std::string dir = temp_dir("ckpt_other_run");
  LinearRun run;
  const std::string path = run.save(dir, 2, "run-a");
  EXPECT_THROW(
      {
        try {
          run.save(dir, 2, "run-b");
        } catch (const ckpt::CheckpointWriteFailed& e) {
          EXPECT_NE(std::string(e.what()).find("is run run-a's checkpoint, not this run's (run-b): it is not "
                                               "replaced"), std::string::npos) << e.what();
          throw;
        }
      },
      ckpt::CheckpointWriteFailed);
  EXPECT_EQ(ckpt::run_id_of(path), "run-a");
  EXPECT_EQ(ckpt::verify_checkpoint_files(path), "");
  EXPECT_FALSE(io::path_exists(path + ".partial"));
  EXPECT_EQ(run.save(dir, 2, "run-a"), path);  // a resumed run redoing its own step
  io::remove_tree(dir);
}

// A full disk during a save (a tmpfs too small for the second checkpoint; needs root to mount): the save fails with
// the system's reason and the file, the partial directory is gone, and the first checkpoint still verifies.
TEST(CheckpointSaves, AFailedWriteLeavesNothingAndKeepsTheEarlierOne) {
  const testing::TempDir dir("shardtrain_ckpt_full_disk_");
  const std::string mnt = dir.path + "/full";
  const testing::SmallDisk disk(mnt, "256k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  LinearRun small(3), large(40000);  // 40000 x 2 weights and two moments: about 1 MB
  const std::string first = small.save(mnt + "/ck", 1, "run");
  try {
    large.save(mnt + "/ck", 2, "run");
    ADD_FAILURE() << "a 1 MB checkpoint fitted a 256 kB disk";
  } catch (const ckpt::CheckpointWriteFailed& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the checkpoint of step 2 was not saved: rank 0: cannot write '" + mnt +
                        "/ck/step-00000002.partial/model.pt"), std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
  }
  EXPECT_EQ(ckpt::list_checkpoints(mnt + "/ck"), std::vector<std::string>{first});
  EXPECT_FALSE(io::path_exists(mnt + "/ck/step-00000002.partial"));
  EXPECT_EQ(ckpt::verify_checkpoint_files(first), "");
}

// Weights or moments holding NaN, in a checkpoint whose manifest matches its bytes (a diverged run's, saved by
// something other than a save that checks): verification names the file and tensor, and loading refuses it as
// damaged before changing anything.
TEST(CheckpointManifest, NonFiniteValuesAreDamage) {
  const std::string dir = temp_dir("ckpt_nan_values");
  LinearRun run;
  const std::string path = run.save(dir, 3, "run");
  auto dict = io::load_pickle(path + "/model.pt").toGenericDict();
  c10::impl::GenericDict damaged(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : dict) {
    at::Tensor t = item.value().toTensor().clone();
    if (item.key().toStringRef() == "weight::exp_avg_sq") t.view({-1})[2] = INFINITY;
    damaged.insert(item.key(), t);
  }
  io::save_pickle(path + "/model.pt", damaged);
  ckpt::Manifest m = ckpt::read_manifest(path);
  m.files = ckpt::describe_files(path, ckpt::checkpoint_files(path));
  ckpt::write_manifest(path, m);
  EXPECT_EQ(ckpt::verify_files(path), "");  // the bytes are as the manifest says
  const std::string problem = ckpt::verify_checkpoint_files(path);
  EXPECT_NE(problem.find("model.pt: 'weight::exp_avg_sq' holds 1 NaN or Inf values of 6 (a diverged run's state)"),
            std::string::npos) << problem;
  const at::Tensor before = run.linear->weight.detach().clone();
  EXPECT_THROW(ckpt::load_checkpoint(path, run.model, run.pg.world()), ckpt::CheckpointDamaged);
  EXPECT_TRUE(at::equal(run.linear->weight.detach(), before));
  io::remove_tree(dir);
}

// One live run per checkpoint directory: a second is refused naming the holder; a lock its holder died with is
// taken over and said; a released one is taken silently.
TEST(CheckpointLock, OneLiveRunPerDirectory) {
  const std::string dir = temp_dir("ckpt_lock");
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::DistEnv{});
  struct Lines : log::Sink {
    std::string text;
    void line(log::Level, const std::string& line) override { text += line + "\n"; }
    void status(const std::string&) override {}
  };
  auto sink = std::make_shared<Lines>();
  const log::Logger logger(sink, 0);
  {
    CheckpointLock first(dir, pg.world(), logger);
    first.set_run("abc123");
    try {
      CheckpointLock second(dir, pg.world(), logger);
      ADD_FAILURE() << "two locks on one directory";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("checkpoint.dir: '" + dir + "' belongs to a run that is still going (run abc123, host "),
                std::string::npos) << what;
      EXPECT_NE(what.find(" pid " + std::to_string(::getpid()) + " since "), std::string::npos) << what;
    }
  }
  EXPECT_TRUE(sink->text.empty()) << sink->text;
  { CheckpointLock again(dir, pg.world(), logger); }
  EXPECT_TRUE(sink->text.empty()) << sink->text;
  // A note without a holder: the run that wrote it died holding the lock.
  io::FileLock(CheckpointLock::file_of(dir)).write_note("run dead1, host h pid 1 since 2026-01-01T00:00:00Z");
  { CheckpointLock taken(dir, pg.world(), logger); }
  EXPECT_NE(sink->text.find("was left by a run that ended without releasing it (run dead1, host h pid 1 since "
                            "2026-01-01T00:00:00Z); this run takes it over"), std::string::npos) << sink->text;
  io::remove_tree(dir);
}

// What a resume may change: nothing of the model; the run's settings only when allowed; the rest freely.
TEST(ResumeCheck, RefusesTheModelAndUnallowedRunChangesAndListsTheRest) {
  config::Config saved;
  saved.optim.lr = 1e-3, saved.train.steps = 100;
  const std::string yaml = config::to_yaml(saved);

  config::Config same = saved;
  same.checkpoint.resume = config::Resume::ALWAYS;  // how the resume was asked: not a change
  const ResumeChanges none = check_resume(yaml, same, "ck", false);
  EXPECT_TRUE(none.allowed.empty() && none.free.empty());

  config::Config changed = saved;
  changed.optim.lr = 5e-4, changed.train.seed = 3, changed.log.interval = 5;
  try {
    check_resume(yaml, changed, "the checkpoint of step 8", false);
    ADD_FAILURE() << "a changed lr and seed resumed";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the checkpoint of step 8 was trained with another config"), std::string::npos) << what;
    EXPECT_NE(what.find("optim.lr 0.001 -> 0.0005 (changes the run: allow it with "
                        "--checkpoint.allow_changes=[optim.lr])"), std::string::npos) << what;
    EXPECT_NE(what.find("train.seed 0 -> 3"), std::string::npos) << what;
    EXPECT_EQ(what.find("log.interval"), std::string::npos) << what;  // free
  }
  changed.checkpoint.allow_changes = {"optim", "train.seed"};
  const ResumeChanges allowed = check_resume(yaml, changed, "ck", false);
  EXPECT_EQ(describe_changes(allowed.allowed), "optim.lr 0.001 -> 0.0005, train.seed 0 -> 3");
  EXPECT_EQ(describe_changes(allowed.free), "log.interval 10 -> 5");

  config::Config model = saved;
  model.model.overrides = {{"layers", 3}};
  model.parallel.strategy = parallel::Strategy::DDP;
  model.checkpoint.allow_changes = {"all"};  // never enough for the model
  try {
    check_resume(yaml, model, "ck", false);
    ADD_FAILURE() << "another model resumed";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.overrides {} -> {layers: 3} (the model"), std::string::npos) << what;
    EXPECT_NE(what.find("parallel.strategy full_shard -> ddp (the checkpoint holds sharded slices, not DDP's"),
              std::string::npos) << what;
  }
  // Under tensor parallelism every strategy saves sharded slices: full_shard -> ddp resumes; DDP's whole model does
  // not become slices.
  config::Config split = saved;
  split.parallel.tp_size = 2;
  const std::string split_yaml = config::to_yaml(split);
  split.parallel.strategy = parallel::Strategy::DDP;
  EXPECT_EQ(describe_changes(check_resume(split_yaml, split, "ck", false).free), "parallel.strategy full_shard -> ddp");
  config::Config whole = saved;
  whole.parallel.strategy = parallel::Strategy::DDP;
  const std::string whole_yaml = config::to_yaml(whole);
  whole.parallel.tp_size = 2;
  try {
    check_resume(whole_yaml, whole, "ck", false);
    ADD_FAILURE() << "DDP's whole model resumed as slices";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp_size 1 -> 2 (the checkpoint holds DDP's whole model"),
              std::string::npos) << e.what();
  }

  config::Config auto_batch = saved;
  auto_batch.train.batch_size = 13;  // what auto resolved to this time
  EXPECT_EQ(describe_changes(check_resume(yaml, auto_batch, "ck", true).free), "train.batch_size 8 -> 13");
  EXPECT_THROW(check_resume(yaml, auto_batch, "ck", false), std::invalid_argument);
}

}  // namespace
}  // namespace shardtrain::train
