// Asynchronous checkpoints (ckpt/async_save.h): what the writer thread writes is, file for file and byte for byte,
// what save_checkpoint writes of the same state — even when the model and its optimizer state change while it
// writes (the staging copy is what is written) — for a sharded model (with the full Hugging Face-named file too)
// and a replicated one, at every world size; a second save reuses the staging buffer; a save while one is in
// flight is refused, and so is one with a NaN in some rank's weights (checked on the copy as it is made).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <numeric>

#include "shardtrain/ckpt/async_save.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/io/files.h"
#include "test_env.h"
#include "toy_model.h"

namespace shardtrain::ckpt {
namespace {

using namespace fsdp::testing_models;
using testing::test_process_group;

std::string scratch_dir(const std::string& what) {
  return "/tmp/shardtrain-test-" + std::to_string(::getppid()) + "-" + what;
}

// One optimizer step of `model` on its share of batch `s`.
void train_step(Toy& model, torch::optim::Optimizer& optimizer, int s, const dist::Communicator& group,
                bool replicated) {
  const auto batches = make_batches();
  optimizer.zero_grad();
  const int64_t local = kBatch / group.size();
  const auto& [x, y] = batches[static_cast<size_t>(s)];
  torch::mse_loss(model(x.narrow(0, group.rank() * local, local)), y.narrow(0, group.rank() * local, local))
      .backward();
  if (replicated) {  // DDP's mean of the gradients, by hand
    for (auto& p : model->parameters()) group.all_reduce(p.mutable_grad(), dist::ReduceOp::MEAN).wait();
  }
  optimizer.step();
}

// Every file under `dir`, relative, sorted.
std::vector<std::string> files_under(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const std::string& name : io::list_directory(dir)) {
    const std::string path = dir + "/" + name, rel = prefix + name;
    if (io::is_directory(path)) {
      for (const std::string& f : files_under(path, rel + "/")) out.push_back(f);
    } else {
      out.push_back(rel);
    }
  }
  return out;
}

void expect_same_files(const std::string& a, const std::string& b, const std::string& label) {
  const std::vector<std::string> files = files_under(a);
  EXPECT_EQ(files, files_under(b)) << label;
  EXPECT_FALSE(files.empty()) << label;
  for (const std::string& f : files) {
    if (!io::path_exists(b + "/" + f)) continue;
    EXPECT_TRUE(io::read_file(a + "/" + f) == io::read_file(b + "/" + f)) << label << ": " << f << " differs";
  }
}

TrainerState state_at(int64_t step) {
  TrainerState s;
  s.step = step, s.run_id = "async-test", s.flavor = "toy", s.strategy = "test";
  return s;
}

TEST(AsyncSave, WritesWhatSaveWritesWhileTheModelChanges) {
  dist::ProcessGroup& pg = test_process_group();
  const dist::Communicator& world = pg.world();
  std::vector<int> all(static_cast<size_t>(world.size()));
  std::iota(all.begin(), all.end(), 0);
  AsyncCheckpointer writer(*pg.new_host_group(all, "async-test writers"));
  for (const bool replicated : {false, true}) {
    const std::string label = replicated ? "replicated" : "sharded";
    torch::manual_seed(11);
    Toy model;
    if (!replicated) fully_shard_model(model.ptr(), world, fsdp::wrap_by_class_name({"Block"}));
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
    CheckpointModel checkpointed{model.ptr(), &optimizer, !replicated, {}};
    if (!replicated) {  // state_dict_type = full: the whole model gathered, under "Hugging Face" names of its own
      for (const auto& p : model->named_parameters()) checkpointed.hf_names.emplace_back(p.key(), "hf." + p.key());
    }
    const std::string sync_dir = scratch_dir("sync-" + label), async_dir = scratch_dir("async-" + label);
    int64_t first_staged = 0;
    for (int64_t step = 1; step <= 2; ++step) {
      train_step(model, optimizer, static_cast<int>(step), world, replicated);
      const std::string saved = save_checkpoint(sync_dir, state_at(step), checkpointed, world);
      const AsyncSaveStarted started = writer.save(async_dir, state_at(step), checkpointed, world);
      EXPECT_EQ(started.path, async_dir + "/" + step_directory_name(step));
      EXPECT_TRUE(writer.in_flight());
      EXPECT_THROW(writer.save(async_dir, state_at(step), checkpointed, world), std::logic_error);
      // What the writer writes is the staged copy: the weights and moments change under it.
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.fill_(-7.0);
      for (auto& [key, state] : optimizer.state()) {
        auto& adam = static_cast<torch::optim::AdamWParamState&>(*state);
        adam.exp_avg().fill_(3.0), adam.exp_avg_sq().fill_(3.0);
      }
      const std::optional<AsyncSaveDone> done = writer.wait();
      ASSERT_TRUE(done.has_value());
      EXPECT_EQ(done->path, started.path);
      EXPECT_EQ(done->step, step);
      EXPECT_FALSE(writer.in_flight());
      EXPECT_FALSE(writer.wait().has_value());
      expect_same_files(saved, done->path, label + " step " + std::to_string(step));
      EXPECT_EQ(verify_checkpoint(done->path, world), "") << label;
      // The same storages at the second save: the staging buffer is the first's, the same size.
      if (step == 1) first_staged = started.staged_bytes;
      EXPECT_EQ(started.staged_bytes, first_staged) << label;
      EXPECT_EQ(writer.staging_bytes(), started.staged_bytes) << label;
      // Back to the saved state (the next step trains from it on both sides).
      load_checkpoint(saved, checkpointed, world);
    }
    // A NaN in the last rank's copy of one weight (not in a padding row): refused on every rank before anything is
    // handed over, the .partial gone, nothing in flight.
    {
      torch::NoGradGuard no_grad;
      if (world.rank() == world.size() - 1) model->parameters().front().view({-1})[0] = std::nan("");
      EXPECT_THROW(writer.save(async_dir, state_at(3), checkpointed, world), NonFiniteState) << label;
      EXPECT_FALSE(writer.in_flight()) << label;
      world.barrier().wait();
      EXPECT_FALSE(io::path_exists(async_dir + "/" + step_directory_name(3) + ".partial")) << label;
      EXPECT_EQ(list_checkpoints(async_dir).size(), 2u) << label;
    }
    // Each rank stages what it writes: under DDP only rank 0 writes the model (its generator states aside).
    if (replicated && world.rank() != 0) EXPECT_LT(first_staged, 64 * 1024) << label;
    EXPECT_GT(first_staged, 0) << label;
    world.barrier().wait();
    if (world.rank() == 0) io::remove_tree(sync_dir), io::remove_tree(async_dir);
  }
}

}  // namespace
}  // namespace shardtrain::ckpt
