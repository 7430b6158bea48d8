// fully_shard runtime behaviour beyond the parity grid: gradient accumulation without communication, the gradient
// divide factor, buffer and output dtypes, prefetch bounds from the runtime's own instrumentation, stale prefetches,
// errors instead of wrong results when freed parameters are read, and a gradient overflow on one rank skipping the
// loss-scaled step on every rank.
#include <gtest/gtest.h>
#include <limits>
#include <ATen/native/ForeachUtils.h>
#include <torch/torch.h>

#include "test_env.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/grad_scaler.h"
#include "parity_helpers.h"
#include "support/expect_error.h"

namespace shardtrain::fsdp {
namespace {

using testing::expect_params_equal;
using testing::local_rows;
using testing::test_process_group;
using namespace testing_models;

// One SGD step of the single-process reference on (x, y): what the sharded model's step is compared with.
template <class Module>
void reference_step(Module& ref, torch::optim::SGD& sgd, const at::Tensor& x, const at::Tensor& y) {
  sgd.zero_grad();
  torch::mse_loss(ref->forward(x), y).backward();
  sgd.step();
}

Toy sharded_toy(const FsdpOptions& options = {}) {
  torch::manual_seed(42);
  Toy model;
  for (auto& b : model->blocks) fully_shard(b.ptr(), test_process_group().world(), options);
  fully_shard(model.ptr(), test_process_group().world(), options);
  return model;
}

TEST(FsdpRuntime, NoSyncAccumulatesLocallyThenReducesTheSum) {
  auto batches = make_batches();
  Toy ref = testing::accumulated_reference();

  for (bool reshard : {true, false}) {
    FsdpOptions options;
    options.reshard_after_forward = reshard;
    Toy model = sharded_toy(options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    {
      NoSync no_sync(model.ptr());
      reset_fsdp_stats(model.ptr());
      (torch::mse_loss(model(local_rows(batches[0].first)), local_rows(batches[0].second)) / 2).backward();
      EXPECT_EQ(fsdp_stats(model.ptr()).reduce_scatters, 0) << "no_sync backward communicated gradients";
      for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED);
      for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "gradients appeared early";
    }
    (torch::mse_loss(model(local_rows(batches[1].first)), local_rows(batches[1].second)) / 2).backward();
    // One per unit; a group of one installs its gradients without any.
    EXPECT_EQ(fsdp_stats(model.ptr()).reduce_scatters, test_process_group().world_size() == 1 ? 0 : 4);
    sgd.step();
    expect_params_equal(gather_full_parameters(model.ptr()), *ref,
                        std::string("no_sync reshard=") + (reshard ? "on" : "off"));
  }
}

TEST(FsdpRuntime, NoReshardAfterBackwardSkipsTheNextGathers) {
  // Gradient accumulation keeping parameters unsharded between micro-batches: the same training, fewer all-gathers.
  // Per micro-batch, 4 units: SHARD_GRAD_OP gathers each once (forward), FULL_SHARD the 3 blocks twice (forward,
  // backward) and the root once (it stays gathered from its forward into the backward that follows).
  if (test_process_group().world_size() == 1) GTEST_SKIP() << "a group of one holds full parameters: nothing to gather";
  auto batches = make_batches();
  Toy ref = testing::accumulated_reference();
  for (bool reshard_after_forward : {false, true}) {
    const std::string label = reshard_after_forward ? "FULL_SHARD" : "SHARD_GRAD_OP";
    FsdpOptions options;
    options.reshard_after_forward = reshard_after_forward;
    Toy model = sharded_toy(options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    set_reshard_after_backward(model.ptr(), false);
    {
      NoSync no_sync(model.ptr());
      (torch::mse_loss(model(local_rows(batches[0].first)), local_rows(batches[0].second)) / 2).backward();
      for (const FsdpUnit& unit : units_of(model.ptr())) {
        if (unit.sharded_numel() > 0) EXPECT_EQ(unit.state(), ShardState::UNSHARDED) << label;
      }
    }
    reset_fsdp_stats(model.ptr());
    (torch::mse_loss(model(local_rows(batches[1].first)), local_rows(batches[1].second)) / 2).backward();
    // SHARD_GRAD_OP: nothing gathered at all; FULL_SHARD: forward found its units gathered, backward gathers the
    // blocks again (the root stayed gathered).
    EXPECT_EQ(fsdp_stats(model.ptr()).all_gathers, reshard_after_forward ? 3 : 0) << label;
    // A backward with gradient sync reshards whatever the setting: the optimizer steps shards.
    for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED) << label;
    sgd.step();
    expect_params_equal(gather_full_parameters(model.ptr()), *ref, label + " without reshard after backward");
  }
}

TEST(FsdpRuntime, OverflowOnOneRankSkipsTheScaledStepOnEvery) {
  const dist::Communicator& world = test_process_group().world();
  FsdpOptions options;
  options.mixed_precision.param_dtype = torch::kHalf;
  options.mixed_precision.reduce_dtype = torch::kFloat;
  Toy model = sharded_toy(options);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1024}, world);
  const auto before = gather_full_parameters(model.ptr());
  auto [x, y] = make_batches().front();
  scaler.scale(torch::mse_loss(model(local_rows(x)), local_rows(y))).backward();
  if (world.rank() == world.size() - 1) {  // the last rank alone: its shard of some gradient overflowed
    for (const auto& p : model->parameters()) {
      if (p.grad().defined() && p.grad().numel() > 0) {
        p.grad().view({-1})[0] = std::numeric_limits<float>::infinity();
        break;
      }
    }
  }
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 512.0);
  const auto after = gather_full_parameters(model.ptr());
  for (const auto& [name, value] : before) EXPECT_TRUE(torch::equal(after.at(name), value)) << name << " moved";
}

TEST(FsdpRuntime, GradientDivideFactorDividesTheSum) {
  const int w = test_process_group().world_size();
  const auto batch = make_batches().front();
  const torch::Tensor& x = batch.first;
  const torch::Tensor& y = batch.second;
  auto global_norm = [&](std::optional<double> factor) {
    FsdpOptions options;
    options.gradient_divide_factor = factor;
    Toy model = sharded_toy(options);
    torch::mse_loss(model(local_rows(x)), local_rows(y)).backward();
    return clip_grad_norm(model.ptr(), 1e9);
  };
  const double mean = global_norm(std::nullopt);
  // Summed over W ranks and divided by 2W: half the mean.
  EXPECT_NEAR(global_norm(2.0 * w), mean / 2, 1e-5 * mean) << "W=" << w;
  EXPECT_NEAR(global_norm(static_cast<double>(w)), mean, 1e-5 * mean) << "W=" << w;
  FsdpOptions bad;
  bad.gradient_divide_factor = 0.0;
  torch::manual_seed(1);
  Block block;
  testing::expect_error<std::invalid_argument>([&] { fully_shard(block.ptr(), test_process_group().world(), bad); },
                                               {"gradient_divide_factor = 0"});
}

struct NormedImpl : nn::Interceptable<NormedImpl, at::Tensor(at::Tensor)> {
  NormedImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    scale = register_buffer("scale", torch::full({4}, 0.5));
  }
  at::Tensor forward_impl(at::Tensor x) { return fc(x) * scale; }
  torch::nn::Linear fc{nullptr};
  at::Tensor scale;
};

TEST(FsdpRuntime, MixedPrecisionDtypes) {
  auto model = std::make_shared<NormedImpl>();
  FsdpOptions options;
  options.mixed_precision.param_dtype = torch::kBFloat16;
  options.mixed_precision.reduce_dtype = torch::kFloat;
  options.mixed_precision.buffer_dtype = torch::kBFloat16;
  options.mixed_precision.output_dtype = torch::kFloat;
  fully_shard(model, test_process_group().world(), options);
  EXPECT_EQ(model->scale.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->fc->weight.scalar_type(), torch::kFloat);  // the sharded master
  at::Tensor out = model->forward(torch::randn({2, 4}));     // float32 input cast to bf16 inside
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  out.sum().backward();
  EXPECT_EQ(model->fc->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(model->fc->weight.scalar_type(), torch::kFloat);
}

// A 0-dim parameter (FLAVA's logit scale) and a weight used transposed.
struct ScaledImpl : nn::Interceptable<ScaledImpl, at::Tensor(at::Tensor)> {
  ScaledImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 6));
    proj = register_parameter("proj", torch::randn({5, 6}));
    logit_scale = register_parameter("logit_scale", torch::tensor(2.0));
  }
  at::Tensor forward_impl(at::Tensor x) { return fc(x).matmul(proj.t()) * logit_scale; }
  torch::nn::Linear fc{nullptr};
  at::Tensor proj, logit_scale;
};

// After backward every sharded parameter's gradient is what CUDA's fused optimizers demand of it (ATen's
// check_fast_path_restrictions: the parameter's dtype, sizes and strides, dense), with and without mixed
// precision. At one rank without it the full gradients were installed as they came, a 0-dim gradient for the
// (1)-shaped shard of a 0-dim parameter, which CUDA's _fused_adamw_ refused (flava-350m in float32, 2026-11-28).
TEST(FsdpRuntime, GradientsTakeTheShardsLayout) {
  for (const bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "bf16 parameters, float32 reductions" : "float32");
    torch::manual_seed(3);
    auto model = std::make_shared<ScaledImpl>();
    FsdpOptions options;
    if (mixed) {
      options.mixed_precision.param_dtype = torch::kBFloat16;
      options.mixed_precision.reduce_dtype = torch::kFloat;
    }
    fully_shard(model, test_process_group().world(), options);
    model->forward(torch::randn({3, 4})).sum().backward();
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      const at::Tensor& p = item.value();
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().sizes(), p.sizes()) << name;
      const std::vector<at::Tensor> params{p}, grads{p.grad()};
      EXPECT_TRUE(at::native::check_fast_path_restrictions({params, grads}))
          << name << ": gradient " << p.grad().sizes() << " strides " << p.grad().strides() << ", parameter "
          << p.sizes() << " strides " << p.strides();
    }
  }
}

// Peak units holding full parameters, from the runtime's own counters, in the second step (the first records the
// order prefetching follows). The root's forward encloses every block's, so the root counts as a running unit.
struct Peaks {
  int64_t forward, backward, prefetches;
};
Peaks measure_peaks(int forward_prefetch, bool limit, BackwardPrefetch backward, MixedPrecision mp = {}) {
  FsdpOptions options;
  options.forward_prefetch = forward_prefetch;
  options.limit_all_gathers = limit;
  options.backward_prefetch = backward;
  options.mixed_precision = mp;
  Toy model = sharded_toy(options);
  auto [x, y] = make_batches().front();
  torch::mse_loss(model(local_rows(x)), local_rows(y)).backward();
  reset_fsdp_stats(model.ptr());
  at::Tensor loss = torch::mse_loss(model(local_rows(x)), local_rows(y));
  Peaks peaks{fsdp_stats(model.ptr()).peak_unsharded_units, 0, fsdp_stats(model.ptr()).prefetches};
  reset_fsdp_stats(model.ptr());
  loss.backward();
  peaks.backward = fsdp_stats(model.ptr()).peak_unsharded_units;
  peaks.prefetches += fsdp_stats(model.ptr()).prefetches;
  return peaks;
}

TEST(FsdpRuntime, PrefetchBoundsUnshardedUnits) {
  if (test_process_group().world_size() == 1) GTEST_SKIP() << "a group of one holds full parameters: nothing to gather";
  // No prefetch: the root and the running block.
  Peaks none = measure_peaks(0, true, BackwardPrefetch::NONE);
  EXPECT_EQ(none.forward, 2);
  EXPECT_EQ(none.backward, 2);
  EXPECT_EQ(none.prefetches, 0);
  // One ahead: the root, the running block and the prefetched one. Forward prefetches blocks 0, 1, 2 (from the
  // root and blocks 0, 1); backward prefetches blocks 1 and 0 (from blocks 2, 1) and block 2 from the root.
  Peaks one = measure_peaks(1, true, BackwardPrefetch::BACKWARD_PRE);
  EXPECT_EQ(one.forward, 3);
  EXPECT_EQ(one.backward, 3);
  EXPECT_EQ(one.prefetches, 6);
  // Two ahead, limited: still one gathered ahead. Unlimited: two.
  EXPECT_EQ(measure_peaks(2, true, BackwardPrefetch::NONE).forward, 3);
  EXPECT_EQ(measure_peaks(2, false, BackwardPrefetch::NONE).forward, 4);
  // BACKWARD_POST gathers the next unit once the current one's gradients are reduced: no more than without.
  EXPECT_EQ(measure_peaks(0, true, BackwardPrefetch::BACKWARD_POST).backward, 2);
}

TEST(FsdpRuntime, ForwardPrefetchFollowsThePreviousForwardsPath) {
  if (test_process_group().world_size() == 1) GTEST_SKIP() << "a group of one holds full parameters: nothing to gather";
  // Forward prefetch gathers the unit that ran next in the previous forward. When the path changes (Toy's active
  // blocks; FLAVA's batch kinds), one forward gathers a unit that does not run, which is dropped as backward
  // starts rather than held through it, and the next forward follows the new path. Before, the first forward's
  // order was kept for good and the unused gather held until the end of backward. Trains as one process.
  FsdpOptions options;
  options.forward_prefetch = 1;
  options.backward_prefetch = BackwardPrefetch::NONE;
  Toy model = sharded_toy(options);
  torch::manual_seed(42);
  Toy ref;
  torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  struct Step {
    int blocks;
    int64_t forward_prefetches;  // root -> block 0 -> block 1 (-> block 2) in the previous forward's order
  };
  const std::vector<Step> steps = {{3, 0},   // no previous forward
                                   {2, 3},   // the 3-block order: block 2 gathered, not run
                                   {2, 2},   // the 2-block order
                                   {3, 2},   // the 2-block order: block 2 gathered when it runs
                                   {3, 3}};  // the 3-block order
  const auto batches = make_batches();
  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s) + ", " + std::to_string(steps[s].blocks) + " blocks");
    const auto& [x, y] = batches[s % batches.size()];
    ref->active_blocks = model->active_blocks = steps[s].blocks;
    reference_step(ref, ref_sgd, x, y);
    sgd.zero_grad();
    reset_fsdp_stats(model.ptr());
    at::Tensor loss = torch::mse_loss(model(local_rows(x)), local_rows(y));
    EXPECT_EQ(fsdp_stats(model.ptr()).prefetches, steps[s].forward_prefetches);
    reset_fsdp_stats(model.ptr());
    loss.backward();
    // The root (gathered from forward to the end of backward) and the block running its backward.
    EXPECT_EQ(fsdp_stats(model.ptr()).peak_unsharded_units, 2);
    sgd.step();
  }
  expect_params_equal(gather_full_parameters(model.ptr()), *ref, "forward prefetch along a changing path");
}

TEST(FsdpRuntime, MixedPrecisionReshardsEachUnitDuringBackward) {
  // Gathering in another dtype swaps each parameter's data for one of that dtype, which drops autograd's cached
  // AccumulateGrad node: a node made afresh at the next use would lack the hook that tells a unit its gradients
  // are complete, and every unit would stay gathered (and its reduction wait) until the end of backward — what
  // SHARD_GRAD_OP holds. With the hook kept, the same bound as in float32: the root and the running block. Even a
  // group of one gathers here (its bf16 copy of the float32 shard).
  for (const at::ScalarType reduce : {torch::kBFloat16, torch::kFloat}) {
    SCOPED_TRACE(c10::toString(reduce));
    MixedPrecision mp;
    mp.param_dtype = torch::kBFloat16;
    mp.reduce_dtype = reduce;
    const Peaks peaks = measure_peaks(0, true, BackwardPrefetch::NONE, mp);
    EXPECT_EQ(peaks.forward, 2);
    EXPECT_EQ(peaks.backward, 2);
  }
}

TEST(FsdpRuntime, OneReduceScatterInFlightDuringBackward) {
  // With overlap each unit's reduce-scatter runs on while the next unit computes its backward and is waited for
  // when the next one is issued: one full-size reduction input alive at a time, not one per unit until the end of
  // backward. Without (Gloo's default), each is waited for at once: none is alive while another unit computes.
  for (const std::optional<bool> overlap : std::vector<std::optional<bool>>{true, false, std::nullopt}) {
    SCOPED_TRACE(overlap ? (*overlap ? "overlap" : "no overlap") : "the default");
    FsdpOptions options;
    options.overlap_reduce_scatter = overlap;
    Toy model = sharded_toy(options);
    torch::manual_seed(42);
    Toy ref;
    torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    for (const auto& [x, y] : make_batches()) {
      reference_step(ref, ref_sgd, x, y);
      sgd.zero_grad();
      reset_fsdp_stats(model.ptr());
      torch::mse_loss(model(local_rows(x)), local_rows(y)).backward();
      const bool one = test_process_group().world_size() == 1;  // a group of one reduces nothing
      const FsdpStats stats = fsdp_stats(model.ptr());
      EXPECT_EQ(stats.reduce_scatters, one ? 0 : 4);
      EXPECT_EQ(stats.peak_reductions_in_flight, one ? 0 : 1);
      // Four units, the root's reduction last: the three before it overlap the next unit's backward, or none do.
      EXPECT_EQ(stats.overlapped_reduce_scatters, one || !overlap.value_or(false) ? 0 : 3);
      sgd.step();
    }
    expect_params_equal(gather_full_parameters(model.ptr()), *ref, "reduce-scatter overlap");
  }
}

TEST(FsdpRuntime, FrozenParametersTakeNoPartInTheReduction) {
  // Block 1's `up` weight frozen, block 2 frozen whole: the frozen parameters get no gradient, take no room in the
  // reduce-scatter's input (before, their rows were reduced as zeros: FLAVA's frozen codebook doubled its root
  // unit's reduction), a unit of frozen parameters reduces nothing, and the rest trains as in one process.
  auto build = [] {
    torch::manual_seed(3);
    auto m = std::make_shared<WideImpl>();
    m->blocks[1]->up->weight.requires_grad_(false);
    for (auto& p : m->blocks[2]->parameters()) p.requires_grad_(false);
    return m;
  };
  auto ref = build();
  auto model = build();
  for (auto& b : model->blocks) fully_shard(b.ptr(), test_process_group().world(), {});
  fully_shard(model, test_process_group().world(), {});
  const int64_t w = test_process_group().world_size();
  int64_t trainable_bytes = 0;  // each trainable parameter's rows padded to a multiple of W, float32
  for (const auto& p : ref->parameters()) {
    if (p.requires_grad()) trainable_bytes += (p.size(0) + w - 1) / w * w * (p.numel() / p.size(0)) * 4;
  }
  torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(8);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = torch::randn({12, 64}), y = torch::randn({12, 64});
    reference_step(ref, ref_sgd, x, y);
    sgd.zero_grad();
    reset_fsdp_stats(model);
    torch::mse_loss(model->forward(local_rows(x)), local_rows(y)).backward();
    const FsdpStats stats = fsdp_stats(model);
    EXPECT_EQ(stats.reduce_scatters, w == 1 ? 0 : 3) << "block 2 has nothing to reduce";
    EXPECT_EQ(stats.reduce_scatter_input_bytes, w == 1 ? 0 : trainable_bytes);
    EXPECT_FALSE(model->blocks[1]->up->weight.grad().defined());
    for (const auto& p : model->blocks[2]->parameters()) EXPECT_FALSE(p.grad().defined());
    sgd.step();
  }
  expect_params_equal(gather_full_parameters(model), *ref, "frozen parameters");
  torch::manual_seed(3);
  const auto initial = std::make_shared<WideImpl>();
  EXPECT_TRUE(torch::equal(gather_full_parameters(model).at("blocks1.up.weight"), initial->blocks[1]->up->weight));
}

TEST(FsdpRuntime, RootStaysGatheredIntoBackwardUnlessGradientsWaitAside) {
  // FULL_SHARD keeps the root gathered from its forward into the backward that follows (one all-gather fewer);
  // with last step's gradients still there, as when zero_grad() comes between forward and backward, it reshards
  // so that zero_grad() reaches them: training in that order equals one process's (it accumulated across steps).
  auto batches = make_batches();
  torch::manual_seed(42);
  Toy ref;
  torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
  Toy model = sharded_toy();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  for (size_t step = 0; step < batches.size(); ++step) {
    const auto& [x, y] = batches[step];
    at::Tensor ref_loss = torch::mse_loss(ref(x), y);
    ref_sgd.zero_grad();
    ref_loss.backward();
    ref_sgd.step();
    at::Tensor loss = torch::mse_loss(model(local_rows(x)), local_rows(y));
    const FsdpUnit root = units_of(model.ptr()).front();
    const bool gradients_aside = step > 0;
    if (test_process_group().world_size() > 1) {
      EXPECT_EQ(root.state(), gradients_aside ? ShardState::SHARDED : ShardState::UNSHARDED) << "step " << step;
    }
    sgd.zero_grad();
    loss.backward();
    sgd.step();
  }
  expect_params_equal(gather_full_parameters(model.ptr()), *ref, "zero_grad between forward and backward");
}

// Two linears of which forward uses one: the unused one gets no gradient on any rank.
struct HalfUsedImpl : nn::Interceptable<HalfUsedImpl, at::Tensor(at::Tensor)> {
  HalfUsedImpl() {
    used = register_module("used", torch::nn::Linear(8, 8));
    unused = register_module("unused", torch::nn::Linear(8, 8));
  }
  at::Tensor forward_impl(at::Tensor x) { return used(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(HalfUsed);

TEST(FsdpRuntime, ParametersNoRankUsedTakeNoPartInTheReduction) {
  // On Gloo the ranks agree before reducing which parameters any of them has a gradient for, and `unused`, which
  // no rank computes through, takes no room in the reduce-scatter, as in FSDP2 (before, its rows were reduced as
  // zeros: FLAVA's text-only steps reduced every image head of the root, 390 of a 644 ms backward at W=2). Its
  // gradient stays undefined, and the rest trains as in one process. Installed gradients share the reduction's
  // memory where every reduced parameter got one (here, on Gloo) and are copies where some did not (`unused` on
  // NCCL): either way tensors of their own that zero_grad(set_to_none=false) can detach and zero in place, and
  // the next step's gradients are the next step's alone.
  for (const bool set_to_none : {true, false}) {
    SCOPED_TRACE(set_to_none ? "zero_grad(set_to_none=true)" : "zero_grad(set_to_none=false)");
    torch::manual_seed(5);
    HalfUsed ref;
    torch::manual_seed(5);
    HalfUsed model;
    fully_shard(model.ptr(), test_process_group().world(), {});
    const int64_t w = test_process_group().world_size();
    int64_t used_bytes = 0;  // `used`'s rows padded to a multiple of W, float32
    for (const auto& p : ref->used->parameters()) {
      used_bytes += (p.size(0) + w - 1) / w * w * (p.numel() / p.size(0)) * 4;
    }
    torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::manual_seed(6);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor x = torch::randn({12, 8}), y = torch::randn({12, 8});
      ref_sgd.zero_grad(set_to_none);
      torch::mse_loss(ref(x), y).backward();
      ref_sgd.step();
      sgd.zero_grad(set_to_none);
      reset_fsdp_stats(model.ptr());
      torch::mse_loss(model(local_rows(x)), local_rows(y)).backward();
      EXPECT_EQ(fsdp_stats(model.ptr()).reduce_scatter_input_bytes, w == 1 ? 0 : used_bytes);
      EXPECT_FALSE(model->unused->weight.grad().defined());
      EXPECT_FALSE(model->unused->bias.grad().defined());
      sgd.step();
    }
    expect_params_equal(gather_full_parameters(model.ptr()), *ref, "a parameter no rank used");
  }
}

TEST(FsdpRuntime, ShardingFreesTheModulesOwnParameters) {
  // A model built in full, then sharded: what stays allocated is each rank's shards (1/W of the parameters, plus
  // row padding), not the shards next to the module's original tensors. Found on the GPU: the full parameters
  // stayed allocated beside the shards (2x the model at W = 1).
  memory::install_cpu_memory_counter();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  auto model = std::make_shared<WideImpl>();
  int64_t full = 0;
  for (const auto& p : model->parameters()) full += p.nbytes();
  for (auto& b : model->blocks) fully_shard(b.ptr(), test_process_group().world(), {});
  fully_shard(model, test_process_group().world(), {});
  const double kept = static_cast<double>(memory::cpu_memory_stats().current_bytes - before) / full;
  const double w = test_process_group().world_size();
  EXPECT_LT(kept, 1.0 / w + 0.05) << "bytes kept after sharding, as a fraction of the full parameters";
  std::cout << "after sharding: " << kept << " x the full parameters (1/W = " << 1.0 / w << ")" << std::endl;
  // Trained a step, then dropped: nothing of the model stays (on the GPU the shards of a destroyed model did).
  {
    torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(1e-3));
    torch::mse_loss(model->forward(torch::randn({8, 64})), torch::zeros({8, 64})).backward();
    adam.step();
  }
  model.reset();
  EXPECT_EQ(memory::cpu_memory_stats().current_bytes - before, 0) << "bytes still allocated after the model is gone";

  // The same for blocks sharded as roots of their own, chained by the caller (as the CUDA offload test does).
  {
    std::vector<WideBlock> blocks;
    std::vector<at::Tensor> params;
    for (int i = 0; i < 4; ++i) {
      blocks.emplace_back();
      fully_shard(blocks.back().ptr(), test_process_group().world(), {});
      for (const auto& p : blocks.back()->parameters()) params.push_back(p);
    }
    torch::optim::AdamW adam(params, torch::optim::AdamWOptions(1e-3));
    for (int step = 0; step < 2; ++step) {
      adam.zero_grad();
      at::Tensor x = torch::randn({8, 64});
      for (auto& b : blocks) x = b->forward(x);
      x.pow(2).mean().backward();
      adam.step();
    }
  }
  EXPECT_EQ(memory::cpu_memory_stats().current_bytes - before, 0) << "bytes still allocated after the blocks are gone";
}

TEST(FsdpRuntime, BackwardFreesFullParametersBeforeReducing) {
  // Bytes allocated during backward beyond what was live before it, counted by our allocator, in units of one
  // block's full parameters (U), without prefetching (so each gather completes before its block computes). While
  // block i computes its gradients: its full parameters (U), its full gradients (U), block i+1's reduce-scatter in
  // flight (its input U, and on Gloo the all-to-all's receive buffer U), and the reduced shards of the blocks
  // after that (U/W each, installed as gradients at the end) — at most 4U + 3U/W. A unit resharding only after it
  // issued its reduce-scatter, or waiting for the previous one only after it allocated its own input, holds its
  // parameters, gradients, reduction input and the previous reduction at once: 5U + 3U/W at block 0.
  memory::install_cpu_memory_counter();
  FsdpOptions options;
  options.backward_prefetch = BackwardPrefetch::NONE;
  torch::manual_seed(1);
  auto model = std::make_shared<WideImpl>();
  for (auto& b : model->blocks) fully_shard(b.ptr(), test_process_group().world(), options);
  fully_shard(model, test_process_group().world(), options);
  const double unit = 4.0 * (256 * 64 + 256 + 64 * 256 + 64);  // float32 bytes of one block's parameters
  const at::Tensor x = torch::randn({8, 64});                  // activations: a few KB, next to U = 132 KB
  // The least of three steps: Work::wait() gives a Gloo worker thread up to 20 ms to release a finished
  // operation's buffers, which a machine with more ranks than cores may exceed once.
  double least = std::numeric_limits<double>::infinity();
  for (int step = 0; step < 3; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor loss = torch::mse_loss(model->forward(x), torch::zeros({8, 64}));
    const int64_t before = memory::cpu_memory_stats().current_bytes;
    memory::reset_cpu_peak();
    loss.backward();
    least = std::min(least, static_cast<double>(memory::cpu_memory_stats().peak_bytes - before) / unit);
  }
  const double w = test_process_group().world_size();
  EXPECT_LE(least, 4.5 + 3.0 / w) << "bytes allocated during backward, in units of one block's parameters";
  std::cout << "backward transient memory: " << least << " x one block's parameters (bound " << 4.5 + 3.0 / w << ")"
            << std::endl;
}

TEST(FsdpRuntime, UnusedPrefetchIsDroppedBeforeTheNextForward) {
  if (test_process_group().world_size() == 1) GTEST_SKIP() << "a group of one holds full parameters: nothing to gather";
  // A forward without backward (evaluation) that gathers ahead a unit it does not run: the gather is dropped when
  // the root's next forward starts, so shards changed meanwhile are gathered afresh, never read from it. (Before,
  // it stayed pending into the next forward and was caught there as stale.)
  FsdpOptions options;
  options.forward_prefetch = 1;
  Toy model = sharded_toy(options);
  auto [x, y] = make_batches().front();
  torch::mse_loss(model(x), y).backward();  // records the order
  torch::NoGradGuard no_grad;
  model->active_blocks = 2;
  model(x);  // block 1 prefetches block 2, which does not run
  for (auto& p : model->parameters()) p.add_(0.25);  // the shards change under the pending prefetch
  model->active_blocks = 3;
  reset_fsdp_stats(model.ptr());
  at::Tensor out = model(x);
  const FsdpStats stats = fsdp_stats(model.ptr());
  EXPECT_EQ(stats.stale_prefetches, 0);
  EXPECT_EQ(stats.prefetches, 2);   // root -> block 0 -> block 1, the previous forward's path
  EXPECT_EQ(stats.all_gathers, 4);  // those, the root's and block 2's own
  // The output is that of the current parameters.
  Toy plain;
  auto full = gather_full_parameters(model.ptr());
  for (auto& p : plain->named_parameters()) p.value().copy_(full.at(p.key()));
  EXPECT_TRUE(torch::allclose(out, plain(x), 1e-5, 1e-6));
}

// A layer that keeps an intermediate: a loss taken from it bypasses the unit's output, so the unit's backward never
// starts (nothing gathers its parameters again, nothing reduces what they receive). The gradient that reaches a
// parameter outside its unit's backward is refused by the unit's state machine, naming the parameter and why —
// at every world size, a group of one included — rather than landing unreduced or reading freed storage.
struct LeakyImpl : nn::Interceptable<LeakyImpl, at::Tensor(at::Tensor)> {
  LeakyImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  at::Tensor forward_impl(at::Tensor x) {
    hidden = fc(x);
    return hidden * 2;
  }
  torch::nn::Linear fc{nullptr};
  at::Tensor hidden;
};

TEST(FsdpRuntime, ABackwardThatBypassesTheUnitsOutputIsAClearError) {
  auto model = std::make_shared<LeakyImpl>();
  fully_shard(model, test_process_group().world());
  at::Tensor x = torch::randn({2, 4}, torch::requires_grad());
  model->forward(x);
  testing::expect_error<std::logic_error>([&] { model->hidden.sum().backward(); },
                                          {"parameter 'fc.", "received a gradient while its unit was",
                                           "the unit's output was not on the path of this backward"});
}

TEST(FsdpRuntime, ForwardWithoutGradReshardsEveryStrategy) {
  FsdpOptions options;
  options.reshard_after_forward = false;
  Toy model = sharded_toy(options);
  torch::NoGradGuard no_grad;
  model(make_batches().front().first);
  for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED);
}

TEST(FsdpRuntime, AUnitCalledTwiceReshardsBetweenItsCallsBackwards) {
  if (test_process_group().world_size() == 1) GTEST_SKIP() << "a group of one holds full parameters: nothing to gather";
  // Every block called twice in a forward (Toy::passes, as FLAVA calls its encoder layers unmasked then masked):
  // backward runs the second pass's blocks (2, 1, 0), whose gradients stay partial in autograd's buffers, then the
  // first pass's, which complete them. Each block reshards after its second call's backward and gathers again for
  // its first call's ([Note: a unit called twice]): one block gathered at a time. Before, all three stayed
  // gathered from their second call's backward to their first's (4 units at once, no reshard between calls).
  // Prefetching follows the calls: forward root, b0, b1, b2, b0, b1, b2 (each call gathers the next one's unit:
  // 6), backward b2, b1, b0, b2, b1, b0 (the root prefetches the first, each call the next: 6). Following units
  // instead, the second b0 found nothing before it in backward (5) and the first b2 nothing after it in forward (5).
  struct Case {
    bool reshard_after_forward;
    int forward_prefetch;
    BackwardPrefetch backward_prefetch;
    int64_t peak_units, backward_gathers, forward_prefetches, backward_prefetches;
  };
  const std::vector<Case> cases = {
      // The root and the block computing, each block gathered for each call's backward.
      {true, 0, BackwardPrefetch::NONE, 2, 6, 0, 0},
      // Every block is gathered as backward starts; the second calls' backwards reshard them.
      {false, 0, BackwardPrefetch::NONE, 4, 3, 0, 0},
      // The root, the block computing and the next call's, every gather a prefetch.
      {true, 1, BackwardPrefetch::BACKWARD_PRE, 3, 6, 6, 6},
  };
  for (const Case& c : cases) {
    const std::string label = std::string(c.reshard_after_forward ? "resharding" : "not resharding") +
                              " after forward, forward prefetch " + std::to_string(c.forward_prefetch) +
                              (c.backward_prefetch == BackwardPrefetch::NONE ? ", no" : ", BACKWARD_PRE") +
                              " backward prefetch";
    FsdpOptions options;
    options.reshard_after_forward = c.reshard_after_forward;
    options.forward_prefetch = c.forward_prefetch;
    options.backward_prefetch = c.backward_prefetch;
    Toy model = sharded_toy(options);
    torch::manual_seed(42);
    Toy ref;
    model->passes = ref->passes = 2;
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD ref_sgd(ref->parameters(), torch::optim::SGDOptions(0.1));
    int step = 0;
    for (const auto& [x, y] : make_batches()) {
      const std::string at = label + ", step " + std::to_string(step);
      reference_step(ref, ref_sgd, x, y);
      sgd.zero_grad();
      reset_fsdp_stats(model.ptr());
      at::Tensor loss = torch::mse_loss(model(local_rows(x)), local_rows(y));
      // (The first forward has no previous one to follow.)
      if (step++ > 0) EXPECT_EQ(fsdp_stats(model.ptr()).prefetches, c.forward_prefetches) << at;
      reset_fsdp_stats(model.ptr());
      loss.backward();
      const FsdpStats stats = fsdp_stats(model.ptr());
      EXPECT_EQ(stats.reshards_between_calls, 3) << at;
      EXPECT_EQ(stats.peak_unsharded_units, c.peak_units) << at;
      EXPECT_EQ(stats.all_gathers, c.backward_gathers) << at;
      EXPECT_EQ(stats.prefetches, c.backward_prefetches) << at;
      for (const FsdpUnit& unit : units_of(model.ptr())) EXPECT_EQ(unit.state(), ShardState::SHARDED) << at;
      sgd.step();
    }
    expect_params_equal(gather_full_parameters(model.ptr()), *ref, "blocks called twice, " + label);
  }
}

}  // namespace
}  // namespace shardtrain::fsdp
