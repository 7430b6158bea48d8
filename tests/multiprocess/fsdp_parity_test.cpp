// fully_shard parity: N training steps of a small transformer-like model, sharded over the world (W = 1..4 as the
// binary is launched), give the same losses and final parameters as one process training the same model on the
// whole batch. Grid: strategy {FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2} x
// {float32, bfloat16 params with float32 reduction (float16 with loss scaling: its own test)} x reshard after
// forward {on, off} x prefetch {none, forward + BACKWARD_PRE, BACKWARD_POST} x activation checkpointing of every
// block {off, on}, each with SGD or AdamW in turn (expect_parity_grid says why; at W = 3, 4 a pairwise subset of
// the combinations); Adafactor, blocks called twice in a forward, CPU offload and activation offload over smaller
// grids (FsdpParity.Adafactor, FsdpParity.UnitsCalledTwice, FsdpParity.CpuOffload, FsdpParity.ActivationOffload); hybrid runs on a 2x2 mesh at W = 4,
// 2x1 at W = 2 and 1x3 at W = 3.
// Sizes are odd so that dim-0 sharding pads (10 rows over 3 or 4 ranks, 26 over 4, 3 over 4: some ranks hold only
// padding). Tolerance: see expect_parity.
#include <gtest/gtest.h>
#include <chrono>
#include <functional>
#include <map>
#include <thread>
#include <torch/torch.h>

#include "test_env.h"
#include "toy_model.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/activation_offload.h"
#include "shardtrain/nn/intercept.h"
#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/grad_scaler.h"
#include "support/expect_error.h"

namespace shardtrain::fsdp {
namespace {

using testing::test_process_group;
using namespace testing_models;

enum class Opt { SGD, ADAMW, ADAFACTOR };

// Float32; bfloat16 compute with float32 reduction; float16 compute with float32 reduction and loss scaling.
enum class Precision { FP32, BF16, FP16 };
constexpr double kLossScale = 1024;  // float16: grads of the toy model stay below 64, so scaled ones stay finite

// Adafactor with every part that spans a whole parameter in use: the parameter's RMS (scale_parameter), column
// statistics and the mean row statistic of matrices, the update's RMS; and a first moment, weight decay.
// `sharding`: the sharded model's rows (the statistics summed over its shard group).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<at::Tensor> params,
                                                        std::optional<optim::RowSharding> sharding = std::nullopt) {
  if (opt == Opt::SGD) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (opt == Opt::ADAFACTOR) {
    auto o = optim::AdafactorOptions(3e-2).relative_step(false).scale_parameter(true).beta1(0.9).weight_decay(0.05);
    return std::make_unique<optim::Adafactor>(std::move(params), o, std::move(sharding));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

// Single-process training on the whole batch. Low precision by hand, as PyTorch's MixedPrecision defines it —
// float32 master weights updated by the optimizer, a bfloat16 (float16) copy computing forward and backward, float32
// outputs and gradients — with the batch taken as `micro_batches` equal micro-batches whose low-precision gradients
// are averaged in float32: the arithmetic of data parallelism over that many ranks with a float32 reduction.
// Float16 scales the loss by kLossScale before backward and divides the float32 gradients by it, as GradScaler does.
Run train_reference(Opt opt, Precision precision, int micro_batches, int passes = 1) {
  torch::manual_seed(42);
  Toy model;
  Toy compute;
  model->passes = compute->passes = passes;
  auto optimizer = make_optimizer(opt, model->parameters());
  const at::ScalarType low = precision == Precision::FP16 ? torch::kHalf : torch::kBFloat16;
  const double scale = precision == Precision::FP16 ? kLossScale : 1.0;
  Run run;
  for (auto& [x, y] : make_batches()) {
    optimizer->zero_grad();
    if (precision == Precision::FP32) {
      at::Tensor loss = torch::mse_loss(model(x), y);
      loss.backward();
      optimizer->step();
      run.losses.push_back(loss.item<double>());
      continue;
    }
    {
      torch::NoGradGuard no_grad;
      auto master = model->parameters();
      auto copy = compute->parameters();
      for (size_t i = 0; i < master.size(); ++i) copy[i].set_data(master[i].to(low));
    }
    auto master = model->parameters();
    auto copy = compute->parameters();
    const int64_t rows = kBatch / micro_batches;
    double loss_sum = 0;
    for (int m = 0; m < micro_batches; ++m) {
      compute->zero_grad();
      at::Tensor out = compute(x.narrow(0, m * rows, rows).to(low)).to(torch::kFloat);
      at::Tensor loss = torch::mse_loss(out, y.narrow(0, m * rows, rows));
      (loss * scale).backward();
      loss_sum += loss.item<double>();
      for (size_t i = 0; i < master.size(); ++i) {
        at::Tensor g = copy[i].grad().to(torch::kFloat);
        master[i].mutable_grad() = master[i].grad().defined() ? master[i].grad() + g : g;
      }
    }
    for (auto& p : master) p.mutable_grad().div_(micro_batches * scale);
    optimizer->step();
    run.losses.push_back(loss_sum / micro_batches);
  }
  for (const auto& p : model->named_parameters()) run.params[p.key()] = p.value().detach().clone();
  return run;
}

const char* strategy_name(parallel::Strategy s) {
  switch (s) {
    case parallel::Strategy::FULL_SHARD: return "FULL_SHARD";
    case parallel::Strategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case parallel::Strategy::NO_SHARD: return "NO_SHARD";
    case parallel::Strategy::HYBRID_SHARD: return "HYBRID_SHARD";
    case parallel::Strategy::HYBRID_SHARD_ZERO2: return "HYBRID_SHARD_ZERO2";
    case parallel::Strategy::DDP: return "DDP";
  }
  return "?";
}

enum class Prefetch { NONE, FORWARD_AND_BACKWARD_PRE, BACKWARD_POST };

struct Config {
  Opt opt = Opt::SGD;
  parallel::Strategy strategy = parallel::Strategy::FULL_SHARD;
  bool reshard_after_forward = true;
  Precision precision = Precision::FP32;
  Prefetch prefetch = Prefetch::NONE;
  bool checkpoint = false;  // activation checkpointing on every block (inside its unit)
  int passes = 1;           // every block called this many times in a forward (Toy::passes)
  bool offload = false;     // CPU offload: shards, gradients and optimizer state in the host tier
  bool activation_offload = false;  // what every block saves for backward in the host tier (inside its unit)

  std::string label() const {
    static const char* prefetch_names[] = {"no-prefetch", "fwd+BACKWARD_PRE", "BACKWARD_POST"};
    return std::string(opt == Opt::SGD ? "SGD " : opt == Opt::ADAMW ? "AdamW " : "Adafactor ") +
           strategy_name(strategy) +
           (reshard_after_forward ? " reshard" : " keep") +
           (precision == Precision::FP32 ? " fp32 " : precision == Precision::BF16 ? " bf16 " : " fp16 ") +
           prefetch_names[static_cast<int>(prefetch)] + (checkpoint ? " checkpointed" : "") +
           (passes > 1 ? " blocks called x" + std::to_string(passes) : "") + (offload ? " offload" : "") +
           (activation_offload ? " activation-offload" : "") +
           " W=" + std::to_string(test_process_group().world_size());
  }
};

FsdpOptions options_for(const Config& c, FsdpOptions options) {
  options.reshard_after_forward = c.reshard_after_forward;
  if (c.precision != Precision::FP32) {
    options.mixed_precision.param_dtype = c.precision == Precision::FP16 ? torch::kHalf : torch::kBFloat16;
    options.mixed_precision.reduce_dtype = torch::kFloat;
  }
  options.offload_params = c.offload;
  options.forward_prefetch = c.prefetch == Prefetch::FORWARD_AND_BACKWARD_PRE ? 1 : 0;
  options.backward_prefetch = c.prefetch == Prefetch::NONE            ? BackwardPrefetch::NONE
                              : c.prefetch == Prefetch::BACKWARD_POST ? BackwardPrefetch::BACKWARD_POST
                                                                      : BackwardPrefetch::BACKWARD_PRE;
  return options;
}

Run train_sharded(const Config& c) {
  dist::ProcessGroup& pg = test_process_group();
  const dist::Communicator& world = pg.world();
  const int w = world.size(), r = world.rank();
  const bool hybrid =
      c.strategy == parallel::Strategy::HYBRID_SHARD || c.strategy == parallel::Strategy::HYBRID_SHARD_ZERO2;
  const int replicate = hybrid ? (w == 4 ? 2 : w == 2 ? 2 : 1) : 1;
  // One mesh per layout for the whole binary: each creation sets up new Gloo groups (a rendezvous through the
  // store), which cost more than the training runs they serve. (Collective: every rank reaches the first use of
  // a layout at the same config.)
  static std::map<int, dist::DeviceMesh> meshes;
  auto found = meshes.find(replicate);
  if (found == meshes.end()) found = meshes.emplace(replicate, dist::DeviceMesh::create(pg, replicate)).first;
  const dist::DeviceMesh& mesh = found->second;
  StrategyGroups groups = strategy_groups(c.strategy, mesh);
  const FsdpOptions options = options_for(c, groups.options);
  torch::manual_seed(42);
  Toy model;  // identical initial weights on every rank (same seed)
  model->passes = c.passes;
  for (auto& b : model->blocks) {
    if (c.checkpoint) nn::apply_activation_checkpoint(*b);
    fully_shard(b.ptr(), groups.shard, options);
  }
  if (c.activation_offload) {
    nn::apply_activation_offloading(model.ptr(), [](const std::string&, torch::nn::Module& m) {
      return dynamic_cast<BlockImpl*>(&m) != nullptr;
    });
  }
  // The model's output in float32 for the loss: output_dtype on the root only (on a block it would hand float32
  // to the root's bf16 head, as in PyTorch).
  FsdpOptions root_options = options;
  if (c.precision != Precision::FP32) root_options.mixed_precision.output_dtype = torch::kFloat;
  fully_shard(model.ptr(), groups.shard, root_options);
  auto optimizer = make_optimizer(c.opt, model->parameters(), row_sharding(model.ptr()));
  std::optional<optim::GradScaler> scaler;
  if (c.precision == Precision::FP16) scaler.emplace(optim::GradScalerOptions{.init_scale = kLossScale}, world);
  Run run;
  const int64_t local = kBatch / w;
  for (auto& [x, y] : make_batches()) {
    optimizer->zero_grad();
    at::Tensor out = model(x.narrow(0, r * local, local));
    EXPECT_EQ(out.scalar_type(), torch::kFloat) << c.label();
    at::Tensor loss = torch::mse_loss(out, y.narrow(0, r * local, local));
    // Instrumentation: after forward, units hold full parameters only when not resharding, and the root, whose
    // backward follows at once (as in FSDP2; units_of lists it first).
    const std::vector<FsdpUnit> units = units_of(model.ptr());
    for (size_t i = 0; i < units.size(); ++i) {
      EXPECT_EQ(units[i].state(), c.reshard_after_forward && i > 0 ? ShardState::SHARDED : ShardState::UNSHARDED)
          << c.label() << " " << units[i].module_name();
    }
    (scaler ? scaler->scale(loss) : loss).backward();
    for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED) << c.label();
    for (const auto& p : model->parameters()) {  // the optimizer sees float32 shards and float32 gradients
      EXPECT_EQ(p.scalar_type(), torch::kFloat) << c.label();
      EXPECT_EQ(p.grad().scalar_type(), torch::kFloat) << c.label();
    }
    if (scaler) {
      EXPECT_TRUE(scaler->step(*optimizer)) << c.label() << ": a gradient overflowed";
      scaler->update();
    } else {
      optimizer->step();
    }
    at::Tensor global = loss.detach().clone();
    world.all_reduce(global, dist::ReduceOp::MEAN).wait();  // equal shares: the mean of means is the batch mean
    run.losses.push_back(global.item<double>());
  }
  run.params = gather_full_parameters(model.ptr());
  // Prefetching needs something to gather: a shard group of more than one rank (NO_SHARD and a 2x1 hybrid mesh
  // hold full parameters).
  if (c.prefetch != Prefetch::NONE && c.reshard_after_forward && groups.shard.size() > 1) {
    EXPECT_GT(fsdp_stats(model.ptr()).prefetches, 0) << c.label();
  }
  return run;
}

// Tolerance, float32 and bfloat16 alike: 1e-5 relative on losses and parameters. The bf16 reference reproduces
// data-parallel mixed precision exactly (bf16 compute per rank's rows, float32 mean), so only the order of the
// float32 sums of W gradients differs (hybrid sharding averages within and then across replicas). Measured over the
// grid at W = 1..4: identical parameters. What the bound must catch, measured by breaking the runtime: computing
// in float32 instead of bf16 moves the parameters by 0.5% (SGD) to 2.4% (AdamW) of their update's L2 norm, reducing
// in bf16 by 0.15% to 0.25% — errors of 1e-4 to 1e-3 per element, 100x above the bound.
void expect_parity(const Config& c, const Run& ref) {
  const std::string label = c.label();
  Run got = train_sharded(c);
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

// The single-process references of a grid, each trained once when first asked for: one per optimizer and precision.
class References {
 public:
  explicit References(int passes) : passes_(passes) {}
  const Run& of(Opt opt, Precision precision) {
    auto found = runs_.find({opt, precision});
    if (found == runs_.end()) {
      const int world = test_process_group().world_size();
      found = runs_.emplace(std::pair{opt, precision}, train_reference(opt, precision, world, passes_)).first;
    }
    return found->second;
  }

 private:
  int passes_;
  std::map<std::pair<Opt, Precision>, Run> runs_;
};

// One strategy against the single-process reference: every combination of what shapes the runtime's schedule
// (precision, resharding, prefetch, checkpointing: which buffers exist in which dtype when, what is gathered and
// reduced in which order), each with one optimizer, SGD and AdamW in turn so that each meets every value of every
// other option. The optimizer steps on the shards the schedule left, the same whatever the schedule was: it is
// crossed with the strategy (the shards it sees) and with precision, not with the schedule's order (Adafactor, whose
// statistics span whole parameters, has its own grid: FsdpParity.Adafactor).
//
// At W = 1 and 2 every combination runs; at W = 3 and 4, which add layouts (uneven chunks, ranks holding only
// padding, a 2 x 2 hybrid mesh) rather than schedules, six combinations in which every value of every option meets
// every value of every other (a pairwise covering array: each prefetch with both values of the other three, and
// those three in all four pairs), each a run of that layout.
bool in_pairwise_set(Precision precision, bool reshard, int prefetch, bool checkpoint) {
  const bool a = precision == Precision::BF16, b = !reshard, d = checkpoint;
  switch (prefetch) {
    case 0: return b == a && d == a;  // (a, b, d): (0, 0, 0), (1, 1, 1)
    case 1: return b != a && d == b;  // (0, 1, 1), (1, 0, 0)
    default: return b == a && d != a; // (0, 0, 1), (1, 1, 0)
  }
}

void expect_parity_grid(parallel::Strategy strategy) {
  References refs(/*passes=*/1);
  const bool every_combination = test_process_group().world_size() <= 2;
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    for (bool reshard : {true, false}) {
      for (int prefetch = 0; prefetch < 3; ++prefetch) {
        for (bool checkpoint : {false, true}) {
          if (!every_combination && !in_pairwise_set(precision, reshard, prefetch, checkpoint)) continue;
          const Opt opt = (reshard + prefetch + checkpoint + (precision == Precision::BF16)) % 2 ? Opt::ADAMW : Opt::SGD;
          expect_parity(Config{opt, strategy, reshard, precision, static_cast<Prefetch>(prefetch), checkpoint},
                        refs.of(opt, precision));
        }
      }
    }
  }
}

// Every strategy in float32 and bf16, SGD and AdamW in turn, each configured by `set` (given the turn), against the
// same single-process references.
void expect_parity_over_strategies(const std::function<void(Config&, int turn)>& set) {
  References refs(/*passes=*/1);
  int turn = 0;
  for (parallel::Strategy strategy :
       {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP, parallel::Strategy::NO_SHARD,
        parallel::Strategy::HYBRID_SHARD, parallel::Strategy::HYBRID_SHARD_ZERO2}) {
    for (Precision precision : {Precision::FP32, Precision::BF16}) {
      const Opt opt = turn++ % 2 ? Opt::ADAMW : Opt::SGD;
      Config c{opt, strategy, strategy != parallel::Strategy::SHARD_GRAD_OP, precision,
               Prefetch::FORWARD_AND_BACKWARD_PRE};
      set(c, turn);
      expect_parity(c, refs.of(opt, precision));
    }
  }
}

// CPU offload computing on the CPU runs the copies it runs under a GPU: the shards, their gradients and the
// optimizer's state live in the host tier (memory::CpuTier::HOST), each gather copies a unit's shards to the
// compute tier first and each reduction its gradients back. Checkpointing with bf16.
TEST(FsdpParity, CpuOffload) {
  expect_parity_over_strategies([](Config& c, int) {
    c.offload = true;
    c.checkpoint = c.precision == Precision::BF16;
  });
}

// Activation offloading of every block, inside its unit: what a block saves for backward (checkpointed: its input)
// in the host tier until its backward. With and without checkpointing, once beside CPU offload.
TEST(FsdpParity, ActivationOffload) {
  expect_parity_over_strategies([](Config& c, int turn) {
    c.activation_offload = true;
    c.checkpoint = turn % 3 == 0;
    c.offload = c.strategy == parallel::Strategy::FULL_SHARD && c.precision == Precision::BF16;
  });
}

TEST(FsdpParity, FullShard) { expect_parity_grid(parallel::Strategy::FULL_SHARD); }
TEST(FsdpParity, ShardGradOp) { expect_parity_grid(parallel::Strategy::SHARD_GRAD_OP); }
TEST(FsdpParity, NoShard) { expect_parity_grid(parallel::Strategy::NO_SHARD); }
TEST(FsdpParity, HybridShard) { expect_parity_grid(parallel::Strategy::HYBRID_SHARD); }
TEST(FsdpParity, HybridShardZero2) { expect_parity_grid(parallel::Strategy::HYBRID_SHARD_ZERO2); }

// Every block called twice in a forward (FLAVA's encoder layers run unmasked, then masked): each unit's gradients
// complete only in its first call's backward, and it reshards between its calls' backwards ([Note: a unit called
// twice] in lib/core/src/fsdp/fsdp_unit.cpp). Every strategy, float32 and bf16, every prefetch, with and without
// resharding after forward and checkpointing; SGD and AdamW in turn (as in expect_parity_grid).
TEST(FsdpParity, UnitsCalledTwice) {
  References refs(/*passes=*/2);
  int turn = 0;
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    for (parallel::Strategy strategy : {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP,
                                        parallel::Strategy::NO_SHARD, parallel::Strategy::HYBRID_SHARD,
                                        parallel::Strategy::HYBRID_SHARD_ZERO2}) {
      for (Prefetch prefetch : {Prefetch::NONE, Prefetch::FORWARD_AND_BACKWARD_PRE, Prefetch::BACKWARD_POST}) {
        const Opt opt = turn++ % 2 ? Opt::ADAMW : Opt::SGD;
        const bool reshard = prefetch != Prefetch::BACKWARD_POST, checkpoint = prefetch != Prefetch::NONE;
        expect_parity(Config{opt, strategy, reshard, precision, prefetch, checkpoint, /*passes=*/2},
                      refs.of(opt, precision));
      }
    }
  }
}

// Adafactor's statistics that span a whole parameter (a matrix's column means and mean row statistic, the RMS of the
// parameter and of the update) summed over the shard group: every strategy (padding rows at W = 3, 4, a rank holding
// only padding in the head), float32 and bf16 compute, with and without resharding and checkpointing, against one
// process stepping whole parameters.
TEST(FsdpParity, Adafactor) {
  for (Precision precision : {Precision::FP32, Precision::BF16}) {
    const shardtrain::fsdp::Run ref = train_reference(Opt::ADAFACTOR, precision, test_process_group().world_size());
    for (parallel::Strategy strategy : {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP,
                                      parallel::Strategy::NO_SHARD, parallel::Strategy::HYBRID_SHARD,
                                      parallel::Strategy::HYBRID_SHARD_ZERO2}) {
      for (bool reshard : {true, false}) {
        const Prefetch prefetch = Prefetch::FORWARD_AND_BACKWARD_PRE;
        expect_parity(Config{Opt::ADAFACTOR, strategy, reshard, precision, prefetch, /*checkpoint=*/!reshard}, ref);
      }
    }
  }
}

// Float16 compute with a float32 reduction and loss scaling (optim::GradScaler over the world), every strategy,
// against the reference doing the same by hand.
TEST(FsdpParity, Float16WithLossScaling) {
  for (Opt opt : {Opt::SGD, Opt::ADAMW}) {
    const shardtrain::fsdp::Run ref = train_reference(opt, Precision::FP16, test_process_group().world_size());
    for (parallel::Strategy strategy : {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP,
                                      parallel::Strategy::NO_SHARD, parallel::Strategy::HYBRID_SHARD,
                                      parallel::Strategy::HYBRID_SHARD_ZERO2}) {
      for (bool checkpoint : {false, true}) {
        expect_parity(Config{opt, strategy, true, Precision::FP16, Prefetch::NONE, checkpoint}, ref);
      }
    }
  }
}

// A checkpointed region holding units of its own: the root is checkpointed, so its replay in backward runs the
// blocks' units again (they gather, compute and register their backward hooks inside the replay), and their
// gradients still leave through the outer backward. Every strategy, fp32, against the plain reference.
TEST(FsdpParity, CheckpointedRegionAroundUnits) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size(), r = world.rank();
  const shardtrain::fsdp::Run ref = train_reference(Opt::ADAMW, Precision::FP32, w);
  for (parallel::Strategy strategy : {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP,
                                    parallel::Strategy::NO_SHARD}) {
    const std::string label = std::string("checkpointed root ") + strategy_name(strategy);
    StrategyGroups groups = strategy_groups(strategy, dist::DeviceMesh::create(test_process_group(), 1));
    torch::manual_seed(42);
    Toy model;
    for (auto& b : model->blocks) fully_shard(b.ptr(), groups.shard, groups.options);
    nn::apply_activation_checkpoint(*model);
    fully_shard(model.ptr(), groups.shard, groups.options);
    auto optimizer = make_optimizer(Opt::ADAMW, model->parameters());
    const int64_t local = kBatch / w;
    size_t step = 0;
    for (auto& [x, y] : make_batches()) {
      optimizer->zero_grad();
      at::Tensor loss = torch::mse_loss(model(x.narrow(0, r * local, local)), y.narrow(0, r * local, local));
      loss.backward();
      for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED) << label;
      optimizer->step();
      at::Tensor global = loss.detach().clone();
      world.all_reduce(global, dist::ReduceOp::MEAN).wait();
      EXPECT_NEAR(global.item<double>(), ref.losses[step], 1e-5 * std::abs(ref.losses[step])) << label << " " << step;
      ++step;
    }
    const auto full = gather_full_parameters(model.ptr());
    for (const auto& [name, value] : ref.params) {
      EXPECT_TRUE(torch::allclose(full.at(name), value, 1e-5, 1e-6)) << label << " " << name;
    }
  }
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

// What the Wide model's shards take on a rank of a group of `ranks`: (parameter, gradient, AdamW's two moments) x 4
// bytes x sharded elements, each parameter keeping ceil(rows / W) rows (padding included); 4 blocks of up
// (256 x 64, 256) and down (64 x 256, 64).
int64_t wide_model_state_bytes(int64_t ranks) {
  auto rows = [&](int64_t n) { return (n + ranks - 1) / ranks; };
  const int64_t per_block = rows(256) * 64 + rows(256) + rows(64) * 256 + rows(64);
  return 4 * 4 * 4 * per_block;
}

// The Wide model sharded over `group` trains one AdamW step; returns what the step left allocated in each tier
// (compute, host) above what was there before, the model still alive. A Gloo worker thread drops its reference to
// a finished operation (and its buffers) just after wait() returns: up to a second is given for the compute tier
// to come down to `settled` bytes. A real leak stays.
std::pair<int64_t, int64_t> wide_step_bytes(const dist::Communicator& group, bool offload, int64_t settled) {
  const int64_t compute_before = memory::cpu_memory_stats().current_bytes;
  const int64_t host_before = memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes;
  torch::manual_seed(1);
  auto model = std::make_shared<WideImpl>();
  FsdpOptions options;
  options.offload_params = offload;
  for (auto& b : model->blocks) fully_shard(b.ptr(), group, options);
  fully_shard(model, group, options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::mse_loss(model->forward(torch::randn({8, 64})), torch::zeros({8, 64})).backward();
  {
    const memory::CpuTierScope tier(offload ? memory::CpuTier::HOST : memory::CpuTier::COMPUTE);
    optimizer.step();  // creates exp_avg and exp_avg_sq; gradients stay
  }
  int64_t compute = memory::cpu_memory_stats().current_bytes - compute_before;
  for (int i = 0; i < 100 && compute > settled; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    compute = memory::cpu_memory_stats().current_bytes - compute_before;
  }
  return {compute, memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes - host_before};
}

// Offloaded on a CPU, the model state after a step is in the host tier to the byte (shards, gradients and AdamW's
// moments), and none of it in the compute tier: what a GPU would hold between steps is nothing. Without offload the
// host tier stays empty.
TEST(FsdpParity, CpuOffloadKeepsTheModelStateInTheHostTier) {
  memory::install_cpu_memory_counter();
  const dist::Communicator& world = test_process_group().world();
  const int64_t state = wide_model_state_bytes(world.size());
  const auto [compute, host] = wide_step_bytes(world, /*offload=*/true, /*settled=*/0);
  EXPECT_EQ(host, state) << "W=" << world.size();
  EXPECT_EQ(compute, 0) << "W=" << world.size() << ": the compute tier keeps model state after the step";
  const auto [compute_on_device, host_unused] = wide_step_bytes(world, /*offload=*/false, state);
  EXPECT_EQ(host_unused, 0);
  EXPECT_LE(compute_on_device, state);
  EXPECT_GE(compute_on_device, state * 9 / 10);
}

TEST(FsdpParity, FullShardModelStateAtFourRanksIsUnderAThirdOfOne) {
  // Parameters, gradients and AdamW state per rank, measured by the counting allocator: sharded over the world
  // against the same model "sharded" over this rank alone (world size 1), in the same process.
  if (test_process_group().world_size() != 4) GTEST_SKIP() << "needs world size 4";
  memory::install_cpu_memory_counter();
  const int64_t one = wide_step_bytes(dist::Communicator::single(test_process_group().rank()), false,
                                      wide_model_state_bytes(1)).first;
  const int64_t four = wide_step_bytes(test_process_group().world(), false, wide_model_state_bytes(4)).first;
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
  testing::expect_error<std::invalid_argument>([&] { fully_shard(plain, test_process_group().world()); },
                                               {"does not derive from shardtrain::nn::Interceptable"});
}

}  // namespace
}  // namespace shardtrain::fsdp
