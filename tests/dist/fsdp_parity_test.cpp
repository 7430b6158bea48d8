// fully_shard parity: N training steps of a small transformer-like model, sharded over the world (W = 1..4 as the
// binary is launched), give the same losses and final parameters as one process training the same model on the
// whole batch. Grid: strategy {FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2} x optimizer
// {SGD, AdamW}; hybrid runs on a 2x2 mesh at W = 4, 2x1 at W = 2 and 1x3 at W = 3.
// Sizes are odd so that dim-0 sharding pads (10 rows over 3 or 4 ranks, 26 over 4, 3 over 4: some ranks hold only
// padding). float32 tolerance: 1e-5 relative.
#include <gtest/gtest.h>
#include <chrono>
#include <thread>
#include <torch/torch.h>

#include "dist_test_env.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::fsdp {
namespace {

using testing::test_process_group;

constexpr int64_t kIn = 6, kDim = 10, kHidden = 26, kOut = 3, kBatch = 12, kSteps = 4;

struct BlockImpl : nn::Interceptable<BlockImpl, at::Tensor(at::Tensor)> {
  BlockImpl() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
  }
  at::Tensor forward_impl(at::Tensor x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct ToyImpl : nn::Interceptable<ToyImpl, at::Tensor(at::Tensor)> {
  ToyImpl() {
    in = register_module("in", torch::nn::Linear(kIn, kDim));
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("blocks" + std::to_string(i), Block()));
    head = register_module("head", torch::nn::Linear(kDim, kOut));
  }
  at::Tensor forward_impl(at::Tensor x) {
    at::Tensor h = in(x);
    for (auto& b : blocks) h = b(h);
    return head(h);
  }
  torch::nn::Linear in{nullptr}, head{nullptr};
  std::vector<Block> blocks;
};
TORCH_MODULE(Toy);

// A wider model for memory measurements: sizes dominate the padding.
struct WideBlockImpl : nn::Interceptable<WideBlockImpl, at::Tensor(at::Tensor)> {
  WideBlockImpl() {
    up = register_module("up", torch::nn::Linear(64, 256));
    down = register_module("down", torch::nn::Linear(256, 64));
  }
  at::Tensor forward_impl(at::Tensor x) { return x + down(torch::relu(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(WideBlock);

struct WideImpl : nn::Interceptable<WideImpl, at::Tensor(at::Tensor)> {
  WideImpl() {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("blocks" + std::to_string(i), WideBlock()));
  }
  at::Tensor forward_impl(at::Tensor x) {
    for (auto& b : blocks) x = b(x);
    return x;
  }
  std::vector<WideBlock> blocks;
};

enum class Opt { SGD, ADAMW };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<at::Tensor> params) {
  if (opt == Opt::SGD) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
}

// The batches of every step, the same on every rank.
std::vector<std::pair<at::Tensor, at::Tensor>> make_batches() {
  torch::manual_seed(7);
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int s = 0; s < kSteps; ++s) batches.emplace_back(torch::randn({kBatch, kIn}), torch::randn({kBatch, kOut}));
  return batches;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Run train_reference(Opt opt) {
  torch::manual_seed(42);
  Toy model;
  auto optimizer = make_optimizer(opt, model->parameters());
  Run run;
  for (auto& [x, y] : make_batches()) {
    optimizer->zero_grad();
    at::Tensor loss = torch::mse_loss(model(x), y);
    loss.backward();
    optimizer->step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model->named_parameters()) run.params[p.key()] = p.value().detach().clone();
  return run;
}

const char* strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
    case ShardingStrategy::HYBRID_SHARD_ZERO2: return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

Run train_sharded(Opt opt, ShardingStrategy strategy) {
  dist::ProcessGroup& pg = test_process_group();
  const dist::Communicator& world = pg.world();
  const int w = world.size(), r = world.rank();
  const bool hybrid = strategy == ShardingStrategy::HYBRID_SHARD || strategy == ShardingStrategy::HYBRID_SHARD_ZERO2;
  const int replicate = hybrid ? (w == 4 ? 2 : w == 2 ? 2 : 1) : 1;
  dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, replicate);
  StrategyGroups groups = strategy_groups(strategy, mesh);
  const bool reshard_after_forward = groups.options.reshard_after_forward;
  torch::manual_seed(42);
  Toy model;  // identical initial weights on every rank (same seed)
  for (auto& b : model->blocks) fully_shard(b.ptr(), groups.shard, groups.options);
  fully_shard(model.ptr(), groups.shard, groups.options);
  auto optimizer = make_optimizer(opt, model->parameters());
  Run run;
  const int64_t local = kBatch / w;
  for (auto& [x, y] : make_batches()) {
    optimizer->zero_grad();
    at::Tensor loss = torch::mse_loss(model(x.narrow(0, r * local, local)), y.narrow(0, r * local, local));
    // Instrumentation: after forward, units hold full parameters only when not resharding.
    for (const FsdpUnit& unit : units_of(model.ptr())) {
      EXPECT_EQ(unit.state(), reshard_after_forward ? ShardState::SHARDED : ShardState::UNSHARDED)
          << unit.module_name();
    }
    loss.backward();
    for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED);
    optimizer->step();
    at::Tensor global = loss.detach().clone();
    world.all_reduce(global, dist::ReduceOp::MEAN).wait();  // equal shares: the mean of means is the batch mean
    run.losses.push_back(global.item<double>());
  }
  run.params = gather_full_parameters(model.ptr());
  return run;
}

void expect_parity(Opt opt, ShardingStrategy strategy) {
  const std::string label = std::string(opt == Opt::SGD ? "SGD " : "AdamW ") + strategy_name(strategy) + " W=" +
                            std::to_string(test_process_group().world_size());
  Run ref = train_reference(opt);
  Run got = train_sharded(opt, strategy);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << label << " step " << s;
  }
  ASSERT_EQ(got.params.size(), ref.params.size()) << label;
  for (const auto& [name, value] : ref.params) {
    ASSERT_TRUE(got.params.count(name)) << label << " missing " << name;
    EXPECT_EQ(got.params[name].sizes(), value.sizes()) << label << " " << name;
    EXPECT_TRUE(torch::allclose(got.params[name], value, 1e-5, 1e-6))
        << label << " " << name << " max |diff| " << (got.params[name] - value).abs().max().item<double>();
  }
}

TEST(FsdpParity, FullShard) {
  expect_parity(Opt::SGD, ShardingStrategy::FULL_SHARD);
  expect_parity(Opt::ADAMW, ShardingStrategy::FULL_SHARD);
}
TEST(FsdpParity, ShardGradOp) {
  expect_parity(Opt::SGD, ShardingStrategy::SHARD_GRAD_OP);
  expect_parity(Opt::ADAMW, ShardingStrategy::SHARD_GRAD_OP);
}
TEST(FsdpParity, NoShard) {
  expect_parity(Opt::SGD, ShardingStrategy::NO_SHARD);
  expect_parity(Opt::ADAMW, ShardingStrategy::NO_SHARD);
}
TEST(FsdpParity, HybridShard) {
  expect_parity(Opt::SGD, ShardingStrategy::HYBRID_SHARD);
  expect_parity(Opt::ADAMW, ShardingStrategy::HYBRID_SHARD);
}
TEST(FsdpParity, HybridShardZero2) {
  expect_parity(Opt::SGD, ShardingStrategy::HYBRID_SHARD_ZERO2);
  expect_parity(Opt::ADAMW, ShardingStrategy::HYBRID_SHARD_ZERO2);
}

TEST(FsdpParity, ClipGradNormIsTheGlobalNorm) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size(), r = world.rank();
  auto [x, y] = make_batches().front();
  torch::manual_seed(42);
  Toy reference;
  torch::mse_loss(reference(x), y).backward();
  const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.05);
  torch::manual_seed(42);
  Toy model;
  for (auto& b : model->blocks) fully_shard(b.ptr(), world);
  fully_shard(model.ptr(), world);
  const int64_t local = kBatch / w;
  torch::mse_loss(model(x.narrow(0, r * local, local)), y.narrow(0, r * local, local)).backward();
  const double norm = clip_grad_norm(model.ptr(), 0.05);
  EXPECT_NEAR(norm, expected, 1e-5 * expected) << "W=" << w;
  // The clipped gradients match the reference's clipped gradients: gather them through a step of plain SGD(lr 1).
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1.0));
  torch::optim::SGD ref_sgd(reference->parameters(), torch::optim::SGDOptions(1.0));
  sgd.step();
  ref_sgd.step();
  auto full = gather_full_parameters(model.ptr());
  for (const auto& p : reference->named_parameters()) {
    EXPECT_TRUE(torch::allclose(full[p.key()], p.value(), 1e-5, 1e-6)) << p.key() << " W=" << w;
  }
}

TEST(FsdpParity, FullShardModelStateAtFourRanksIsUnderAThirdOfOne) {
  // Parameters, gradients and AdamW state per rank, measured by the counting allocator: sharded over the world
  // against the same model "sharded" over this rank alone (world size 1), in the same process.
  if (test_process_group().world_size() != 4) GTEST_SKIP() << "needs world size 4";
  memory::install_cpu_memory_counter();
  // What the shards should take: (parameter, gradient, AdamW's two moments) x 4 bytes x sharded elements, each
  // parameter keeping ceil(rows / W) rows; 4 blocks of up (256 x 64, 256) and down (64 x 256, 64).
  auto model_state_bound = [](const dist::Communicator& group) {
    auto rows = [&](int64_t n) { return (n + group.size() - 1) / group.size(); };
    const int64_t per_block = rows(256) * 64 + rows(256) + rows(64) * 256 + rows(64);
    return 4 * 4 * 4 * per_block;
  };
  auto model_state_bytes = [&](const dist::Communicator& group) {
    const int64_t before = memory::cpu_memory_stats().current_bytes;
    torch::manual_seed(1);
    auto model = std::make_shared<WideImpl>();
    for (auto& b : model->blocks) fully_shard(b.ptr(), group);
    fully_shard(model, group);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    torch::mse_loss(model->forward(torch::randn({8, 64})), torch::zeros({8, 64})).backward();
    optimizer.step();  // creates exp_avg and exp_avg_sq; gradients stay
    // A Gloo worker thread drops its reference to a finished operation (and its buffers) just after wait()
    // returns; give it up to a second. A real leak stays and fails the bound below.
    int64_t bytes = memory::cpu_memory_stats().current_bytes - before;
    for (int i = 0; i < 100 && bytes > model_state_bound(group); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      bytes = memory::cpu_memory_stats().current_bytes - before;
    }
    return bytes;
  };
  const int64_t one = model_state_bytes(dist::Communicator::single(test_process_group().rank()));
  const int64_t four = model_state_bytes(test_process_group().world());
  EXPECT_LE(static_cast<double>(four), 0.30 * static_cast<double>(one)) << "W=4 " << four << " B vs W=1 " << one << " B";
  std::cout << "model state per rank: W=1 " << one << " B, W=4 " << four << " B, ratio "
            << static_cast<double>(four) / static_cast<double>(one) << std::endl;
}

TEST(FsdpParity, OptimizerSeesShards) {
  const int w = test_process_group().world_size();
  torch::manual_seed(42);
  Toy model;
  int64_t full = 0;
  for (const auto& p : model->parameters()) full += p.numel();
  for (auto& b : model->blocks) fully_shard(b.ptr(), test_process_group().world());
  fully_shard(model.ptr(), test_process_group().world());
  int64_t held = 0;
  for (const auto& p : model->parameters()) held += p.numel();
  // Each parameter keeps ceil(rows / W) rows: about full / W, plus padding.
  EXPECT_LE(held, full / w + 6 * kDim + 4 * kHidden + 4 * kOut) << "W=" << w;
  if (w == 1) {
    EXPECT_EQ(held, full);
  }
}

TEST(FsdpParity, NotInterceptableIsAClearError) {
  auto plain = std::make_shared<torch::nn::LinearImpl>(3, 3);
  try {
    fully_shard(plain, test_process_group().world());
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("does not derive from shardtrain::nn::Interceptable"), std::string::npos);
  }
}

}  // namespace
}  // namespace shardtrain::fsdp
