// State dicts: a sharded state saved at world size W loads at W/2 and then 1 (4 -> 2 -> 1 at W = 4), from hybrid
// sharding too; a full state loads at any world size; loads check names and shapes. Groups of fewer ranks are
// made in the same job (new_group), so one launch covers the chain.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <cstdlib>

#include "test_env.h"
#include "shardtrain/fsdp/state_dict.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/io/files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/optimizer_state.h"
#include "shardtrain/parallel/vocabulary.h"
#include "toy_model.h"
#include "support/expect_error.h"

namespace shardtrain::fsdp {
namespace {

using testing::test_process_group;
using namespace testing_models;

// A directory every rank of this launch names alike (the workers share the launcher as parent).
std::string scratch_dir(const std::string& what) {
  return "/tmp/shardtrain-test-" + std::to_string(::getppid()) + "-" + what;
}

// A model sharded over `group`, trained `steps` steps (0: as initialised from `seed`).
Toy trained_toy(const dist::Communicator& group, int steps, uint64_t seed, const FsdpOptions& options = {}) {
  torch::manual_seed(seed);
  Toy model;
  model->offset.fill_(0.5 + static_cast<double>(seed));
  fully_shard_model(model.ptr(), group, wrap_by_class_name({"Block"}), options);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
  auto batches = make_batches();
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    const int64_t local = kBatch / group.size();
    auto& [x, y] = batches[s];
    torch::mse_loss(model(x.narrow(0, group.rank() * local, local)), y.narrow(0, group.rank() * local, local)).backward();
    opt.step();
  }
  return model;
}

void expect_same_state(Toy& model, const std::map<std::string, at::Tensor>& expected, const std::string& label) {
  auto full = gather_full_parameters(model.ptr());
  full["offset"] = model->offset;
  ASSERT_EQ(full.size(), expected.size()) << label;
  for (const auto& [name, value] : expected) {
    EXPECT_TRUE(torch::equal(full.at(name), value)) << label << " " << name;
  }
}

std::map<std::string, at::Tensor> state_of(Toy& model) {
  auto state = gather_full_parameters(model.ptr());
  state["offset"] = model->offset.clone();
  return state;
}

TEST(StateDict, ShardedRoundTripsAcrossWorldSizes) {
  dist::ProcessGroup& pg = test_process_group();
  const int w = pg.world_size();
  Toy trained = trained_toy(pg.world(), 2, 42);
  const auto expected = state_of(trained);
  std::string dir = scratch_dir("sharded-" + std::to_string(w));
  save_sharded_state_dict(trained.ptr(), dir);
  EXPECT_TRUE(io::path_exists(dir + "/metadata.pt"));
  EXPECT_TRUE(io::path_exists(dir + "/shard-" + std::to_string(w - 1) + "-of-" + std::to_string(w) + ".pt"));
  // W -> W/2 -> ... -> 1, each from the previous one's files.
  for (int size = w / 2; size >= 1; size /= 2) {
    std::vector<int> ranks(size);
    for (int i = 0; i < size; ++i) ranks[i] = i;
    std::optional<dist::Communicator> group = pg.new_group(ranks, "first" + std::to_string(size));
    const std::string next = scratch_dir("sharded-" + std::to_string(size));
    if (group) {
      Toy fresh = trained_toy(*group, 0, 7);  // different weights and buffer, replaced by the load
      load_sharded_state_dict(fresh.ptr(), dir);
      expect_same_state(fresh, expected, std::to_string(w) + " -> " + std::to_string(size));
      save_sharded_state_dict(fresh.ptr(), next);
    }
    pg.world().barrier().wait();
    dir = next;
  }
  if (w == 1) {  // at least one load happens at every world size
    Toy fresh = trained_toy(pg.world(), 0, 7);
    load_sharded_state_dict(fresh.ptr(), dir);
    expect_same_state(fresh, expected, "1 -> 1");
  }
  pg.world().barrier().wait();
  if (pg.rank() == 0) {
    for (int size = w; size >= 1; size /= 2) io::remove_tree(scratch_dir("sharded-" + std::to_string(size)));
  }
}

// The optimizer's state tensors of `model`'s parameters, as checkpoints save them.
ParamStates optimizer_states(const torch::optim::Optimizer& optimizer, Toy& model) {
  ParamStates states;
  for (const auto& p : model->named_parameters()) {
    auto it = optimizer.state().find(p.value().unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;
    for (auto& [key, t] : optim::state_tensors(*it->second, p.value())) states[key][p.key()] = t;
  }
  return states;
}

// Adafactor's state holds all three splits (first moments like the parameter, row statistics by rows, a matrix's
// column statistics whole): saved by W ranks after 2 steps, loaded on one rank, 2 more steps there equal one process
// stepping all 4 on the whole batch.
TEST(StateDict, AdafactorStateReshardsToOneRank) {
  dist::ProcessGroup& pg = test_process_group();
  const int w = pg.world_size();
  const auto options = optim::AdafactorOptions(3e-2).relative_step(false).beta1(0.9);
  const auto batches = make_batches();
  auto step = [&](Toy& model, torch::optim::Optimizer& optimizer, int s, const dist::Communicator& group) {
    optimizer.zero_grad();
    const int64_t local = kBatch / group.size();
    const auto& [x, y] = batches[s];
    torch::mse_loss(model(x.narrow(0, group.rank() * local, local)), y.narrow(0, group.rank() * local, local))
        .backward();
    optimizer.step();
  };
  Toy sharded = trained_toy(pg.world(), 0, 42);
  optim::Adafactor optimizer(sharded->parameters(), options, row_sharding(sharded.ptr()));
  for (int s = 0; s < 2; ++s) step(sharded, optimizer, s, pg.world());
  const std::string dir = scratch_dir("adafactor-" + std::to_string(w));
  save_sharded_state_dict(sharded.ptr(), dir, optimizer_states(optimizer, sharded));
  std::optional<dist::Communicator> one = w == 1 ? pg.world() : pg.new_group({0}, "adafactor-one");
  if (one) {
    torch::manual_seed(42);
    Toy whole;
    whole->offset.fill_(42.5);  // as trained_toy's seed 42
    optim::Adafactor whole_optimizer(whole->parameters(), options);
    for (int s = 0; s < 4; ++s) step(whole, whole_optimizer, s, *one);

    Toy fresh = trained_toy(*one, 0, 7);
    optim::Adafactor fresh_optimizer(fresh->parameters(), options, row_sharding(fresh.ptr()));
    for (const auto& p : fresh->parameters()) optim::install_empty_state(fresh_optimizer, p, 2);
    load_sharded_state_dict(fresh.ptr(), dir, optimizer_states(fresh_optimizer, fresh));
    for (int s = 2; s < 4; ++s) step(fresh, fresh_optimizer, s, *one);
    const auto got = gather_full_parameters(fresh.ptr());
    for (const auto& p : whole->named_parameters()) {
      EXPECT_TRUE(torch::allclose(got.at(p.key()), p.value(), 1e-5, 1e-6))
          << "W=" << w << " -> 1: " << p.key() << " max |diff| "
          << (got.at(p.key()) - p.value()).abs().max().item<double>();
    }
  }
  pg.world().barrier().wait();
  if (pg.rank() == 0) io::remove_tree(dir);
}

// On CPU the file is written from the shards' own storages (io::save_pickle): saving allocates less than a tenth
// of what it writes (with a copy of each shard, and pickle_save's bytes, it was twice that), and loading it back
// as little (through a mapping of the file).
TEST(StateDict, SavingAndLoadingOnCpuCopyNoShard) {
  dist::ProcessGroup& pg = test_process_group();
  memory::install_cpu_memory_counter();
  torch::manual_seed(5);
  auto model = std::make_shared<WideImpl>();
  fully_shard_model(model, pg.world(), wrap_by_class_name({"WideBlock"}));
  const std::string dir = scratch_dir("no-copies-" + std::to_string(pg.world_size()));
  memory::reset_cpu_peak();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  save_sharded_state_dict(model, dir);
  const int64_t extra = memory::cpu_memory_stats().peak_bytes - before;
  const int64_t written = io::file_size(dir + "/shard-" + std::to_string(pg.rank()) + "-of-" +
                                        std::to_string(pg.world_size()) + ".pt");
  EXPECT_GT(written, 500'000 / pg.world_size()) << "4 blocks of 33k float32 parameters, sharded";
  EXPECT_LT(extra, written / 10) << "rank " << pg.rank();
  auto fresh = std::make_shared<WideImpl>();
  fully_shard_model(fresh, pg.world(), wrap_by_class_name({"WideBlock"}));
  // Loading reads the file through a mapping (io::load_pickle): no storage of it is allocated beside the shards it
  // fills (read into memory, all of them were: the whole file).
  memory::reset_cpu_peak();
  const int64_t before_load = memory::cpu_memory_stats().current_bytes;
  load_sharded_state_dict(fresh, dir);
  EXPECT_LT(memory::cpu_memory_stats().peak_bytes - before_load, written / 10) << "rank " << pg.rank();
  const auto saved = gather_full_parameters(model), loaded = gather_full_parameters(fresh);
  for (const auto& [name, value] : saved) EXPECT_TRUE(torch::equal(loaded.at(name), value)) << name;
  pg.world().barrier().wait();
  if (pg.rank() == 0) io::remove_tree(dir);
}

TEST(StateDict, HybridShardedStateLoadsOnOneRank) {
  dist::ProcessGroup& pg = test_process_group();
  if (pg.world_size() != 4) GTEST_SKIP() << "needs world size 4 (a 2 x 2 mesh)";
  dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, 2);
  StrategyGroups groups = strategy_groups(parallel::Strategy::HYBRID_SHARD, mesh);
  Toy trained = trained_toy(groups.shard, 0, 42, groups.options);
  const auto expected = state_of(trained);
  const std::string dir = scratch_dir("hybrid");
  save_sharded_state_dict(trained.ptr(), dir);  // replica 0 writes 2 shards, replica 1 nothing
  EXPECT_TRUE(io::path_exists(dir + "/shard-1-of-2.pt"));
  EXPECT_FALSE(io::path_exists(dir + "/shard-0-of-4.pt"));
  pg.world().barrier().wait();  // everyone has looked before rank 0 removes the directory
  if (pg.rank() == 0) {
    Toy fresh = trained_toy(dist::Communicator::single(0), 0, 7);
    load_sharded_state_dict(fresh.ptr(), dir);
    expect_same_state(fresh, expected, "hybrid 2x2 -> 1");
    io::remove_tree(dir);
  }
  pg.world().barrier().wait();
}

TEST(StateDict, FullStateLoadsAtAnyWorldSize) {
  dist::ProcessGroup& pg = test_process_group();
  const int w = pg.world_size();
  Toy trained = trained_toy(pg.world(), 2, 42);
  const auto expected = state_of(trained);
  const std::string path = scratch_dir("full") + "/model.pt";
  save_full_state_dict(trained.ptr(), path);
  // Rank 0 alone holds the gathered state; the file is a plain dict of tensors.
  auto held = full_state_dict(trained.ptr());
  EXPECT_EQ(held.size(), pg.rank() == 0 ? expected.size() : 0u);
  auto dict = torch::pickle_load(io::read_file(path)).toGenericDict();
  EXPECT_EQ(dict.size(), expected.size());
  // Python reads it (torch.load's defaults) and saves it again as a model's state_dict() is saved: an OrderedDict
  // with _metadata (which LibTorch's own unpickler cannot read), zip and legacy formats.
  const std::string python = scratch_dir("full") + "/python.pt", legacy = scratch_dir("full") + "/legacy.pt";
  if (pg.rank() == 0) {
    const std::string command = std::string(SHARDTRAIN_PYTHON) + " " + SHARDTRAIN_SOURCE_DIR +
                                "/tests/reference/resave_state_dict.py " + path + " " + python + " " + legacy;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  pg.world().barrier().wait();
  for (const std::string& file : {path, python, legacy}) {
    for (int size : {w, 3, 1}) {
      if (size > w) continue;
      std::vector<int> ranks(size);
      for (int i = 0; i < size; ++i) ranks[i] = i;
      std::optional<dist::Communicator> group = pg.new_group(ranks, "full" + std::to_string(size));
      if (group) {
        Toy fresh = trained_toy(*group, 0, 7);
        load_full_state_dict(fresh.ptr(), file);
        expect_same_state(fresh, expected, file + ": full " + std::to_string(w) + " -> " + std::to_string(size));
      }
    }
  }
  pg.world().barrier().wait();
  if (pg.rank() == 0) io::remove_tree(scratch_dir("full"));
}

TEST(StateDict, LoadErrorsNameWhatDoesNotMatch) {
  Toy model = trained_toy(test_process_group().world(), 0, 1);
  auto state = state_of(model);
  auto expect_error = [&](std::map<std::string, at::Tensor> bad, const std::string& needle) {
    testing::expect_error<std::invalid_argument>([&] { load_full_state_dict(model.ptr(), bad); }, {needle});
  };
  auto missing = state;
  missing.erase("blocks1.fc2.weight");
  expect_error(missing, "missing 'blocks1.fc2.weight'");
  auto misshapen = state;
  misshapen["head.weight"] = torch::zeros({4, 4});
  expect_error(misshapen, "'head.weight' has shape [4, 4], the model's is [3, 10]");
  auto extra = state;
  extra["blocks9.fc1.weight"] = torch::zeros({1});
  expect_error(extra, "unexpected 'blocks9.fc1.weight'");
  testing::expect_error<std::runtime_error>(
      [&] { load_sharded_state_dict(model.ptr(), scratch_dir("does-not-exist")); }, {"no metadata.pt"});
}

}  // namespace
}  // namespace shardtrain::fsdp
