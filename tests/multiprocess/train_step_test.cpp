// The trainer's step (lib/train/src/train/train_step.cpp: micro-batches, loss / M, gradient sync on the last,
// float16 unscaling, clipping by the global norm, a step skipped when float16 gradients overflow) against a plain
// LibTorch loop written out here on one process, at the world size the binary is launched with (1-4), under FSDP
// and DDP. The loop shares only the model and its loss with the trainer: it takes every rank's micro-batches itself,
// divides each loss by M (the average over micro-batches) and the summed gradients by W (the average over ranks that
// the reduction computes), clips, scales and skips by the rules PyTorch documents
// (torch.nn.utils.clip_grad_norm_, torch.amp.GradScaler), and steps torch::optim::SGD with its own parameter groups.
// SGD, not AdamW: AdamW's update is invariant to a gradient's scale, so a wrong 1 / M would pass under it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/nn/autocast.h"
#include "test_env.h"
#include "train/parallel_model.h"
#include "train/train_step.h"

namespace shardtrain::train {
namespace {

using testing::test_process_group;

constexpr int kSteps = 3;
constexpr int64_t kRows = 2, kTokens = 12;  // per rank and micro-batch
constexpr double kLr = 0.05, kMomentum = 0.9, kWeightDecay = 0.01;

struct Case {
  parallel::Strategy strategy;
  int micro_batches;
  double max_grad_norm;  // 0: no clipping
  bool sync_each_batch = false;
  bool fp16 = false;     // float16 with loss scaling from kInitScale (under DDP: autocast)
};
// The first step's float16 gradients overflow at kInitScale (certainly: 2^40), the scale backs off to 2^10, and the
// later steps' do not (certainly); GradScaler's default 2^16 and 0.5 would make the skips depend on the data.
constexpr double kInitScale = 1099511627776.0, kBackoff = 1.0 / (1 << 30);

std::string describe(const Case& c) {
  char clip[32];
  std::snprintf(clip, sizeof clip, "%g", c.max_grad_norm);
  return parallel::to_string(c.strategy) + ", " + std::to_string(c.micro_batches) + " micro-batches, clip " + clip +
         (c.sync_each_batch ? ", sync each batch" : "") + (c.fp16 ? ", fp16" : "");
}

// Micro-batch m of step s for all ranks: W x kRows rows, rank r's are rows [r kRows, (r + 1) kRows); each row
// right-padded to its own length, so that ranks predict different numbers of tokens.
data::Batch global_batch(int64_t vocab, int world, int step, int m) {
  torch::manual_seed(1000 + 10 * step + m);
  const int64_t rows = world * kRows;
  data::Batch b;
  b.kind = data::SampleKind::TEXT;
  b.input_ids = torch::randint(5, vocab, {rows, kTokens}, torch::kLong);
  b.attention_mask = torch::ones({rows, kTokens}, torch::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t length = 4 + (r * 5 + step + m) % (kTokens - 3);
    b.attention_mask[r].narrow(0, length, kTokens - length).zero_();
    b.input_ids[r].narrow(0, length, kTokens - length).fill_(0);
  }
  b.texts = rows;
  return b;
}

data::Batch rows_of(const data::Batch& b, int rank) {
  data::Batch out = b;
  out.input_ids = b.input_ids.narrow(0, rank * kRows, kRows);
  out.attention_mask = b.attention_mask.narrow(0, rank * kRows, kRows);
  out.texts = kRows;
  return out;
}

config::Config config_of(const Case& c) {
  config::Config config;
  config.model.flavor = "llama-debug";
  config.parallel.strategy = c.strategy;
  config.parallel.mixed_precision = c.fp16 ? parallel::Precision::FP16 : parallel::Precision::NO;
  config.train.grad_accum = c.micro_batches;
  config.train.sync_each_batch = c.sync_each_batch;
  config.train.max_grad_norm = c.max_grad_norm;
  config.train.seed = 7;
  config.optim.name = config::OptimizerKind::SGD;
  config.optim.lr = kLr;
  config.optim.momentum = kMomentum;
  config.optim.weight_decay = kWeightDecay;
  return config;
}

struct Steps {
  std::vector<std::vector<double>> losses;  // [step][rank]: the rank's mean loss over its micro-batches
  std::vector<bool> stepped;
  std::map<std::string, at::Tensor> params;
};

// The plain loop: one process, every rank's micro-batches.
Steps plain_loop(const Case& c, const std::shared_ptr<const models::ModelRecipe>& recipe, int world) {
  const config::Config config = config_of(c);
  models::BuildOptions build;
  build.init.seed = static_cast<uint64_t>(config.train.seed);
  build.init.std = config.model.init_std;
  models::ZooModel model = models::build_model(recipe, build);
  model.module->train();
  // Float16: DDP computes under autocast, op by op. FSDP's mixed precision computes every parameter as a float16 copy
  // of its float32 master (param_dtype; buffers stay as they are), each rank's float16 gradients summed over
  // micro-batches and ranks in float32 (reduce_dtype): here a second model holds the copies, refreshed each step.
  const bool cast_params = c.fp16 && c.strategy != parallel::Strategy::DDP;
  models::ZooModel half;
  if (cast_params) {
    half = models::build_model(recipe, build);
    half.module->train();
    for (auto& p : half.module->parameters()) p.set_data(p.detach().to(at::kHalf));
  } else if (c.fp16) {
    nn::autocast_module(*model.module, at::kCPU, at::kHalf);
  }
  torch::nn::Module& computing = cast_params ? *half.module : *model.module;
  // No weight decay for biases and tensors of fewer than two dimensions (norms), as transformers' Trainer groups.
  std::vector<at::Tensor> decay, no_decay, params;
  for (const auto& p : model.module->named_parameters()) {
    const std::string& name = p.key();
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    (bias || p.value().dim() < 2 ? no_decay : decay).push_back(p.value());
    params.push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(
                                 torch::optim::SGDOptions(kLr).momentum(kMomentum).weight_decay(kWeightDecay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(
                                    torch::optim::SGDOptions(kLr).momentum(kMomentum).weight_decay(0)));
  torch::optim::SGD sgd(groups, torch::optim::SGDOptions(kLr));
  const auto task = recipe->task();  // a shared_ptr: kept for the loop
  const int64_t vocab = task->data_needs().vocab_size;
  const int M = c.micro_batches;
  double scale = c.fp16 ? kInitScale : 1.0;
  Steps run;
  const std::vector<at::Tensor> copies = computing.parameters();
  for (int s = 0; s < kSteps; ++s) {
    run.losses.emplace_back(world, 0.0);
    if (cast_params) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) copies[i].copy_(params[i]);
    }
    std::vector<at::Tensor> sums(params.size());  // cast_params: the float32 sums of the float16 gradients
    for (int m = 0; m < M; ++m) {
      const data::Batch batch = global_batch(vocab, world, s, m);
      for (int r = 0; r < world; ++r) {
        const at::Tensor loss = task->compute_losses(computing, rows_of(batch, r), 0).total;
        (loss * (scale / M)).backward();  // a rank's float16 gradients overflow as on that rank
        run.losses[s][r] += loss.item<double>() / M;
        if (!cast_params) continue;
        for (size_t i = 0; i < copies.size(); ++i) {
          at::Tensor g = copies[i].grad();
          if (!g.defined()) continue;
          sums[i] = sums[i].defined() ? sums[i] + g.to(at::kFloat) : g.to(at::kFloat);
          copies[i].mutable_grad() = at::Tensor();
        }
      }
    }
    for (size_t i = 0; i < params.size() && cast_params; ++i) params[i].mutable_grad() = sums[i];
    bool finite = true;
    for (auto& p : params) {
      if (!p.grad().defined()) continue;
      finite = finite && p.grad().isfinite().all().item<bool>();
      p.mutable_grad().div_(scale * world);  // the ranks' mean, unscaled
    }
    if (c.max_grad_norm > 0) {  // clip_grad_norm_: the norm of the parameters' norms; scaled by max / (norm + 1e-6)
      std::vector<at::Tensor> norms;
      for (const auto& p : params) {
        if (p.grad().defined()) norms.push_back(p.grad().norm());
      }
      const double norm = at::stack(norms).norm().item<double>();
      const double coefficient = c.max_grad_norm / (norm + 1e-6);
      if (coefficient < 1) {
        for (auto& p : params) {
          if (p.grad().defined()) p.mutable_grad().mul_(coefficient);
        }
      }
    }
    run.stepped.push_back(finite);
    if (finite) {
      sgd.step();
    } else {
      scale *= kBackoff;  // GradScaler's backoff; its growth after 2000 clean steps does not come within kSteps
    }
    sgd.zero_grad();
  }
  for (const auto& p : model.module->named_parameters()) run.params[p.key()] = p.value().detach().clone();
  return run;
}

// The plain loop run once, on rank 0, and its numbers broadcast: every rank would compute the same ones, W times
// the work of the trainer's step itself (W x M forwards and backwards a step).
Steps shared_plain_loop(const Case& c, const std::shared_ptr<const models::ModelRecipe>& recipe) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size();
  Steps run;
  if (world.rank() == 0) run = plain_loop(c, recipe, w);
  at::Tensor numbers = at::zeros({kSteps, w + 1}, at::kDouble);  // per step: each rank's loss, then stepped
  if (world.rank() == 0) {
    for (int s = 0; s < kSteps; ++s) {
      for (int r = 0; r < w; ++r) numbers[s][r] = run.losses[s][r];
      numbers[s][w] = run.stepped[s] ? 1.0 : 0.0;
    }
  }
  world.broadcast(numbers, 0).wait();
  run.losses.assign(kSteps, std::vector<double>(w));
  run.stepped.assign(kSteps, false);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < w; ++r) run.losses[s][r] = numbers[s][r].item<double>();
    run.stepped[s] = numbers[s][w].item<double>() > 0;
  }
  // The parameters in the model's order, shaped by a model built here (the other ranks have none yet).
  const models::ZooModel shapes = models::build_model(recipe);
  for (const auto& p : shapes.module->named_parameters()) {
    if (world.rank() != 0) run.params[p.key()] = at::empty_like(p.value());
    world.broadcast(run.params.at(p.key()), 0).wait();
  }
  return run;
}

// The trainer's step, each rank its own rows.
Steps trainer_steps(const Case& c, const std::shared_ptr<const models::ModelRecipe>& recipe) {
  const config::Config config = config_of(c);
  dist::ProcessGroup& pg = test_process_group();
  const dist::Communicator& world = pg.world();
  // One mesh for every case: each creation is a rendezvous of new Gloo groups, which costs more than a case's steps.
  // (Collective: every rank creates it in the first case.)
  static const dist::DeviceMesh mesh = dist::DeviceMesh::create(pg, 1);
  ParallelModel model(config, recipe, /*has_unused=*/false, mesh, at::kCPU);
  auto optimizer = make_optimizer(config, model);
  std::optional<optim::GradScaler> scaler;
  if (c.fp16) scaler.emplace(optim::GradScalerOptions{.init_scale = kInitScale, .backoff_factor = kBackoff}, world);
  const auto task = recipe->task();
  StepParts parts{model, *recipe, *task, *optimizer, scaler ? &*scaler : nullptr, at::kCPU,
                  static_cast<uint64_t>(config.train.seed), world};
  const int64_t vocab = task->data_needs().vocab_size;
  Steps run;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<data::Batch> batches;
    for (int m = 0; m < c.micro_batches; ++m) {
      batches.push_back(rows_of(global_batch(vocab, world.size(), s, m), world.rank()));
    }
    const StepTotals totals = train_step(parts, config, std::move(batches));
    run.losses.push_back({totals.loss});
    run.stepped.push_back(totals.stepped);
  }
  if (model.sharded()) {
    run.params = fsdp::gather_full_parameters(model.module());
  } else {
    for (const auto& p : model.module()->named_parameters()) run.params[p.key()] = p.value().detach();
  }
  return run;
}

void expect_trainer_equals_plain_loop(const std::vector<Case>& cases) {
  const auto recipe = models::recipe_of("llama-debug");
  const int rank = test_process_group().rank();
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const Steps expected = shared_plain_loop(c, recipe);
    const Steps got = trainer_steps(c, recipe);
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(got.stepped[s], expected.stepped[s]) << "step " << s;
      EXPECT_NEAR(got.losses[s][0], expected.losses[s][rank], 1e-5 * std::abs(expected.losses[s][rank]))
          << "step " << s;
    }
    // Float32 rounding: the reduction sums the ranks' gradients in another order than the loop.
    for (const auto& [name, value] : expected.params) {
      ASSERT_TRUE(got.params.count(name)) << name;
      EXPECT_LE((got.params.at(name) - value).abs().max().item<double>(), 2e-6) << name;
    }
  }
}

// Gradient accumulation and clipping: M in {1, 3}, clipping off and on (a max norm the gradients exceed), gradients
// reduced on the last micro-batch or on each.
TEST(TrainStep, EqualsAPlainLoopUnderFsdpAndDdp) {
  std::vector<Case> cases;
  for (const auto strategy : {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP,
                              parallel::Strategy::DDP}) {
    for (const int M : {1, 3}) {
      for (const double clip : {0.0, 0.5}) cases.push_back({strategy, M, clip});
    }
    cases.push_back({strategy, 3, 0.5, /*sync_each_batch=*/true});
  }
  expect_trainer_equals_plain_loop(cases);
}

// Float16 with loss scaling: the first step overflows and is skipped on every rank, the scale backs off, then steps
// run on unscaled, clipped gradients. DDP computes under autocast, the loop too; FULL_SHARD and SHARD_GRAD_OP cast
// the parameters to float16 and reduce in float32, the loop too (with accumulation over 3 micro-batches under one).
TEST(TrainStep, Float16SkipsOverflowingStepsAsAPlainLoop) {
  const auto recipe = models::recipe_of("llama-debug");
  const std::vector<Case> cases = {{parallel::Strategy::DDP, 1, 0.5, false, /*fp16=*/true},
                                   {parallel::Strategy::FULL_SHARD, 1, 0.5, false, /*fp16=*/true},
                                   {parallel::Strategy::SHARD_GRAD_OP, 3, 0.5, false, /*fp16=*/true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    ASSERT_EQ(shared_plain_loop(c, recipe).stepped, (std::vector<bool>{false, true, true}));
  }
  expect_trainer_equals_plain_loop(cases);
}

}  // namespace
}  // namespace shardtrain::train
