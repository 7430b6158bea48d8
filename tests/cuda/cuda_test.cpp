// The CUDA/NCCL paths, on a machine with a GPU: one rank under `shardtrain launch` with an NCCL process group.
// Without a CUDA device every test is skipped (the development machine has none; the GPU sessions run it:
// ctest -R cuda). Each compares the device run against plain LibTorch on the same device:
//  - fully_shard (float32, bfloat16, CPU offload, activation checkpointing, blocks called twice) trains as plain
//    training does;
//  - CPU offload keeps shards, gradients and optimizer state off the device (the caching allocator's peak);
//  - a checkpointed layer with dropout replays the forward's CUDA random numbers;
//  - activation offloading's side-stream copies give the plain gradients and lower the peak;
//  - float16 with loss scaling over NCCL, clip_grad_norm, and a sharded model loading from rank 0;
//  - the optimizers' device steps (FusedAdamW's CUDA kernel, AnyPrecision AdamW's multi-tensor step);
//  - a sharded checkpoint written through the host one storage at a time, and loaded back.
#include <ATen/cuda/CUDAContextLight.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <optional>

#include "multiprocess/toy_model.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/fsdp/state_dict.h"
#include "shardtrain/io/files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/blocks.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/activation_offload.h"
#include "shardtrain/nn/float8_linear.h"
#include "optim/anyprecision_foreach.h"
#include "shardtrain/optim/anyprecision_adamw.h"
#include "shardtrain/optim/fused_adamw.h"
#include "shardtrain/optim/grad_scaler.h"
#include "support/layer_stack.h"
#include "support/skip_code.h"

namespace shardtrain {
namespace {

using namespace fsdp::testing_models;

std::optional<dist::ProcessGroup>& group_slot() {
  static std::optional<dist::ProcessGroup> pg;
  return pg;
}
const dist::Communicator& world() { return group_slot()->world(); }

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const at::Device kCuda(at::kCUDA, 0);

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
  int64_t reshards_between_calls = 0;  // sharded: fsdp_stats' count over the steps
};

// Four AdamW steps of the toy model on the device, each block called `passes` times a forward; `shard` applies
// fully_shard (or nothing for the reference).
Trained train_toy(const std::function<void(Toy&)>& shard, int passes = 1) {
  torch::manual_seed(42);
  Toy model;
  model->passes = passes;
  model->to(kCuda);
  shard(model);
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(1e-2));
  Trained t;
  for (auto& [x, y] : make_batches()) {
    adam.zero_grad();
    at::Tensor loss = torch::mse_loss(model(x.to(kCuda)).to(at::kFloat), y.to(kCuda));
    loss.backward();
    adam.step();
    t.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, value] : fsdp::gather_full_parameters(model.ptr())) t.params[name] = value.to(at::kCPU);
  if (!fsdp::units_of(model.ptr()).empty()) {
    t.reshards_between_calls = fsdp::fsdp_stats(model.ptr()).reshards_between_calls;
  }
  return t;
}

// Also with every block called twice a forward (FLAVA's encoders): offloaded, a block's full parameters are a
// device copy, freed between its two calls' backwards ([Note: a unit called twice] in lib/core/src/fsdp/fsdp_unit.cpp) on
// the autograd engine's device thread and gathered again; on the device at one rank they are the shards.
// Float8 linear layers on the GPU's float8 tensor cores (at::_scaled_mm; rowwise through its per-row scales) give
// the CPU's result — the same casts, the product's accumulation order apart — for both recipes.
TEST(Cuda, Float8LinearMatchesTheCpu) {
  REQUIRE_CUDA();
  at::manual_seed(3);
  for (const parallel::Float8Recipe recipe : {parallel::Float8Recipe::TENSORWISE, parallel::Float8Recipe::ROWWISE}) {
    SCOPED_TRACE(parallel::to_string(recipe));
    const at::Tensor x = at::randn({64, 128}).to(at::kBFloat16);
    const at::Tensor weight = (at::randn({96, 128}) / 11).to(at::kBFloat16);
    const at::Tensor grad_y = at::randn({64, 96}).to(at::kBFloat16) * 1e-2;
    std::vector<at::Tensor> results;
    for (const at::Device device : {at::Device(at::kCPU), kCuda}) {
      const at::Tensor xd = x.to(device).requires_grad_(), wd = weight.to(device).requires_grad_();
      const at::Tensor y = nn::float8_linear(xd, wd, {}, recipe);
      y.backward(grad_y.to(device));
      results.push_back(
          at::cat({y.detach().flatten(), xd.grad().flatten(), wd.grad().flatten()}).cpu().to(at::kFloat));
    }
    const double err = (results[0] - results[1]).abs().max().item<double>();
    EXPECT_LE(err, 2.0 / 256 * results[0].abs().max().item<double>());
  }
}

TEST(Cuda, FullShardTrainsLikePlainOnTheDevice) {
  REQUIRE_CUDA();
  for (int passes : {1, 2}) {
    const Trained ref = train_toy([](Toy&) {}, passes);
    for (bool offload : {false, true}) {
      for (bool checkpoint : {false, true}) {
        const std::string label = std::string(offload ? "offload" : "on device") +
                                  (checkpoint ? " checkpointed" : "") + (passes > 1 ? " blocks called twice" : "");
        fsdp::FsdpOptions options;
        options.offload_params = offload;
        const Trained got = train_toy([&](Toy& model) {
          for (auto& b : model->blocks) {
            if (checkpoint) nn::apply_activation_checkpoint(*b);
            fsdp::fully_shard(b.ptr(), world(), options);
          }
          fsdp::fully_shard(model.ptr(), world(), options);
          for (const auto& p : model->parameters()) {
            EXPECT_EQ(p.device().type(), offload ? at::kCPU : at::kCUDA) << label << ": shard device";
          }
        }, passes);
        EXPECT_EQ(got.reshards_between_calls, offload && passes > 1 ? 3 * kSteps : 0) << label;
        for (size_t s = 0; s < ref.losses.size(); ++s) {
          EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s])) << label << " step " << s;
        }
        for (const auto& [name, value] : ref.params) {
          EXPECT_TRUE(torch::allclose(got.params.at(name), value, 1e-5, 1e-6)) << label << " " << name;
        }
      }
    }
  }
}

// Two 1024 x 1024 linears with a residual: x + b(relu(a(x))).
struct BigBlockImpl : nn::Interceptable<BigBlockImpl, at::Tensor(at::Tensor)> {
  BigBlockImpl() {
    a = register_module("a", torch::nn::Linear(1024, 1024));
    b = register_module("b", torch::nn::Linear(1024, 1024));
  }
  at::Tensor forward_impl(at::Tensor x) { return x + b(torch::relu(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

TEST(Cuda, OffloadKeepsShardsOffTheDevice) {
  REQUIRE_CUDA();
  // 8 blocks of 2 x (1024 x 1024): 16.8M parameters, 67 MB; with gradients and AdamW's two moments 268 MB.
  auto peak_of = [](bool offload) {
    torch::manual_seed(1);
    fsdp::FsdpOptions options;
    options.offload_params = offload;
    std::vector<std::shared_ptr<BigBlockImpl>> stack;
    // cuBLAS's workspaces (one per handle and stream, for cuBLAS and cuBLASLt) come from the caching allocator and
    // stay allocated after the products that made them: probably the 65 MiB the previous run left (gpu.md).
    // Released, and what that freed printed, so that both runs start alike.
    const int64_t held = memory::cuda_memory_stats(0).current_bytes;
    at::cuda::clearCublasWorkspaces();
    // What the device holds already.
    const int64_t baseline = memory::cuda_memory_stats(0).current_bytes;
    std::cout << "cuBLAS workspaces released: " << ((held - baseline) >> 20) << " MiB\n";
    for (int i = 0; i < 8; ++i) {
      stack.push_back(std::make_shared<BigBlockImpl>());
      stack.back()->to(kCuda);
      fsdp::fully_shard(stack.back(), world(), options);
    }
    std::vector<at::Tensor> params;
    for (auto& b : stack) {
      for (auto& p : b->parameters()) params.push_back(p);
    }
    torch::optim::AdamW adam(params, torch::optim::AdamWOptions(1e-3));
    memory::reset_cuda_peak(0);
    auto mib = [&] { return std::to_string((memory::cuda_memory_stats(0).current_bytes - baseline) >> 20) + " MiB"; };
    std::cout << (offload ? "offloaded" : "on device") << ": " << (baseline >> 20) << " MiB before, then after sharding "
              << mib();
    for (int step = 0; step < 2; ++step) {
      adam.zero_grad();
      at::Tensor x = torch::randn({64, 1024}, kCuda);
      for (auto& b : stack) x = b->forward(x);
      std::cout << ", step " << step << " forward " << mib();
      x.pow(2).mean().backward();
      std::cout << ", backward " << mib();
      adam.step();
      std::cout << ", step " << mib();
    }
    std::cout << "\n";
    return memory::cuda_memory_stats(0).peak_bytes - baseline;
  };
  const int64_t on_device = peak_of(false), offloaded = peak_of(true);
  std::cout << "CUDA peak above the baseline: on device " << on_device << " B, offloaded " << offloaded << " B\n";
  EXPECT_LT(offloaded + 150'000'000, on_device) << "offload left the model state on the device";
}

// A sharded checkpoint of a model on the device: written one storage at a time through the host (io::save_pickle),
// so the host holds one block's shard at once, not the 67 MB model; it loads back onto the device equal.
TEST(Cuda, CheckpointGoesThroughTheHostOneStorageAtATime) {
  REQUIRE_CUDA();
  memory::install_cpu_memory_counter();
  auto sharded_stack = [](uint64_t seed) {
    torch::manual_seed(seed);
    auto root = std::make_shared<torch::nn::Module>();
    for (int i = 0; i < 8; ++i) {
      auto block = root->register_module("block" + std::to_string(i), std::make_shared<BigBlockImpl>());
      block->to(kCuda);
      fsdp::fully_shard(block, world());
    }
    return root;
  };
  const auto saved = sharded_stack(3);
  const std::string dir = "/tmp/shardtrain-cuda-ckpt-" + std::to_string(::getppid());
  memory::reset_cpu_peak();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  fsdp::save_sharded_state_dict(saved, dir);
  const int64_t host = memory::cpu_memory_stats().peak_bytes - before;
  std::cout << "host memory while saving 67 MB of shards: " << (host >> 20) << " MiB\n";
  EXPECT_LT(host, 20'000'000) << "one block's flat shard (8.4 MB) at a time";
  const auto loaded = sharded_stack(4);
  fsdp::load_sharded_state_dict(loaded, dir);
  const auto a = fsdp::gather_full_parameters(saved), b = fsdp::gather_full_parameters(loaded);
  for (const auto& [name, value] : a) EXPECT_TRUE(torch::equal(b.at(name), value)) << name;
  world().barrier().wait();
  if (world().rank() == 0) io::remove_tree(dir);
}

TEST(Cuda, CheckpointReplaysDropoutOnTheDevice) {
  REQUIRE_CUDA();
  auto run = [](bool checkpoint) {
    torch::manual_seed(3);
    models::TransformerLayerOptions o;
    o.attention.dim = 64, o.attention.heads = 4, o.attention.dropout = 0.2;
    o.mlp_dim = 256, o.dropout = 0.2;
    models::TransformerLayer layer(o, torch::TensorOptions().device(kCuda));
    models::init_parameters(*layer, "", models::WeightInitOptions{.seed = 3, .std = 0.1});
    layer->train();
    if (checkpoint) nn::apply_activation_checkpoint(*layer);
    at::Tensor x = torch::randn({2, 16, 64}, kCuda).requires_grad_(true);
    torch::manual_seed(9);
    layer->forward(x, {}, {}, {}, {}, 0).pow(2).sum().backward();
    std::vector<at::Tensor> grads{x.grad().cpu()};
    for (const auto& p : layer->parameters()) grads.push_back(p.grad().cpu());
    grads.push_back(torch::rand({4}, kCuda).cpu());  // where the random stream was left
    return grads;
  };
  const auto plain = run(false), checkpointed = run(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], checkpointed[i])) << "tensor " << i;
}

// Activation offloading on the device: what a stack of transformer layers with dropout saves goes to pinned host
// memory on a side stream in forward and comes back a layer ahead in backward (nn/activation_offload.h). The
// gradients and the random stream are the plain stack's (the side stream's ordering is what is tested: a copy read
// before it was written, or memory handed out again while a copy used it, shows as wrong gradients), with and
// without checkpointing, and the caching allocator's peak falls.
TEST(Cuda, ActivationOffloadTrainsAlikeAndLowersThePeak) {
  REQUIRE_CUDA();
  enum Mode { PLAIN, OFFLOAD, CHECKPOINT, BOTH };
  auto run = [](Mode mode, std::vector<at::Tensor>& grads) {
    testing::Stack stack = testing::make_stack(0.2);
    stack->to(kCuda);
    auto is_layer = [](const std::string& name, torch::nn::Module&) {
      return name.rfind("layers", 0) == 0 && name.find('.') == std::string::npos;
    };
    if (mode == CHECKPOINT || mode == BOTH) nn::apply_activation_checkpointing(stack.ptr(), is_layer);
    if (mode == OFFLOAD || mode == BOTH) nn::apply_activation_offloading(stack.ptr(), is_layer);
    torch::manual_seed(5);
    const at::Tensor x = torch::randn({4, 512, testing::kDim}, kCuda);  // attention maps (4, 4, 512, 512): 16 MiB
    memory::reset_cuda_peak(0);
    const int64_t before = memory::cuda_memory_stats(0).current_bytes;
    const testing::Result r = testing::run(stack, x, {});
    grads = {r.x_grad.cpu(), r.next_random.cpu()};
    for (const auto& g : r.grads) grads.push_back(g.cpu());
    return memory::cuda_memory_stats(0).peak_bytes - before;
  };
  std::vector<at::Tensor> plain, offloaded, checkpointed, both;
  const int64_t plain_peak = run(PLAIN, plain), offloaded_peak = run(OFFLOAD, offloaded);
  const int64_t checkpointed_peak = run(CHECKPOINT, checkpointed), both_peak = run(BOTH, both);
  std::cout << "CUDA peak: plain " << plain_peak << " B, offloaded " << offloaded_peak << " B, checkpointed "
            << checkpointed_peak << " B, checkpointed and offloaded " << both_peak << " B\n";
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i], offloaded[i], 1e-5, 1e-7)) << "offloaded, tensor " << i;
    EXPECT_TRUE(torch::allclose(plain[i], both[i], 1e-5, 1e-7)) << "checkpointed and offloaded, tensor " << i;
  }
  EXPECT_LT(offloaded_peak * 4, plain_peak * 3);  // two layers' keep of four, and the temporaries
  EXPECT_LE(both_peak, checkpointed_peak);
}

TEST(Cuda, Float16ScalingClippingAndLoadingFromRankZero) {
  REQUIRE_CUDA();
  // float16 compute, float32 reduction, loss scaling over NCCL; an overflow skips the step.
  torch::manual_seed(42);
  Toy model;
  model->to(kCuda);
  fsdp::FsdpOptions options;
  options.mixed_precision.param_dtype = at::kHalf;
  options.mixed_precision.reduce_dtype = at::kFloat;
  for (auto& b : model->blocks) fsdp::fully_shard(b.ptr(), world(), options);
  options.mixed_precision.output_dtype = at::kFloat;  // the root's output only: the blocks feed half-precision layers
  fsdp::fully_shard(model.ptr(), world(), options);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1024}, world());
  auto [x, y] = make_batches().front();
  scaler.scale(torch::mse_loss(model(x.to(kCuda)), y.to(kCuda))).backward();
  scaler.unscale(sgd);
  const double norm = fsdp::clip_grad_norm(model.ptr(), 1e9);
  EXPECT_TRUE(std::isfinite(norm) && norm > 0) << norm;
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  sgd.zero_grad();
  scaler.scale(torch::mse_loss(model(x.to(kCuda)), y.to(kCuda))).backward();
  model->head->weight.mutable_grad().view({-1})[0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 512.0);

  // A Hugging Face file into a sharded model on the device, rank 0 reading and broadcasting over NCCL.
  const std::string path = "/tmp/shardtrain-cuda-test-" + std::to_string(::getpid()) + ".safetensors";
  models::ZooModel source = models::build_model("bert-debug");
  models::save_weights(*source.module, path, source.names);
  models::BuildOptions build;
  build.tensors = build.tensors.device(kCuda);
  build.init.seed = 7;
  const auto mesh = dist::DeviceMesh::create(*group_slot(), 1);
  models::ZooModel sharded = models::build_parallel("bert-debug", mesh, models::ParallelizeOptions{}, build);
  models::load_weights_sharded(sharded.module, path, sharded.names, world());
  const auto full = fsdp::gather_full_parameters(sharded.module);
  for (const auto& p : source.module->named_parameters()) {
    EXPECT_TRUE(torch::equal(full.at(p.key()).cpu(), p.value())) << p.key();
  }
  io::remove_tree(path);
}

// The optimizers' device steps: FusedAdamW's CUDA kernel (at::_fused_adamw_) as LibTorch's AdamW on the same
// device; AnyPrecision AdamW's multi-tensor step (bf16 weights, moments and Kahan compensation: its fused(true)
// on a GPU) as its per-operation step there, to bf16 rounding (a list kernel may order a product differently),
// and both as the CPU's per-operation step, whose scalars also keep float precision.
TEST(Cuda, OptimizerStepsOnTheDevice) {
  REQUIRE_CUDA();
  auto params = [](at::Device device, at::ScalarType dtype) {
    torch::manual_seed(3);
    std::vector<at::Tensor> w = {torch::randn({256, 64}), torch::randn({64}), torch::randn({3, 5, 7})};
    for (at::Tensor& t : w) t = t.to(device, dtype).detach().requires_grad_();
    return w;
  };
  auto train = [](torch::optim::Optimizer& opt, const std::vector<at::Tensor>& w) {
    torch::manual_seed(5);
    for (int step = 0; step < 5; ++step) {
      for (const at::Tensor& t : w) t.mutable_grad() = torch::randn(t.sizes()).to(t.options());
      opt.step();
    }
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : w) out.push_back(t.detach().to(at::kCPU, at::kFloat));
    return out;
  };
  auto expect_close = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double rtol,
                         const char* what) {
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, 1e-5)) << what << ", tensor " << i << ": differs by "
                                                           << (a[i] - b[i]).abs().max().item<double>();
    }
  };

  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  std::vector<at::Tensor> w = params(kCuda, at::kFloat);
  torch::optim::AdamW reference(w, adamw);
  const auto plain = train(reference, w);
  w = params(kCuda, at::kFloat);
  optim::FusedAdamW fused(w, adamw);
  expect_close(train(fused, w), plain, 1e-5, "FusedAdamW on the device");

  auto any = [&](at::Device device, bool lists) {
    std::vector<at::Tensor> v = params(device, at::kBFloat16);
    optim::AnyPrecisionAdamW opt(
        v, optim::AnyPrecisionAdamWOptions(1e-3).weight_decay(0.1).use_kahan_summation(true).fused(lists));
    return train(opt, v);
  };
  {  // the list step takes a pure bf16 parameter's tensors on the device, not a float32 moment beside them
    const at::Tensor w = torch::zeros({4}, at::TensorOptions().device(kCuda).dtype(at::kBFloat16));
    EXPECT_TRUE(optim::foreach_anyprecision_takes(w, w, w, w, w));
    EXPECT_FALSE(optim::foreach_anyprecision_takes(w, w, w.to(at::kFloat), w, w));
  }
  const auto per_operation = any(kCuda, false);
  constexpr double kBf16 = 1.0 / 128;  // one unit in the last place of a bf16 in [1, 2)
  expect_close(any(kCuda, true), per_operation, kBf16, "AnyPrecision's multi-tensor step");
  expect_close(per_operation, any(at::kCPU, false), kBf16, "AnyPrecision per operation, device against CPU");
}

}  // namespace
}  // namespace shardtrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using namespace shardtrain;
  dist::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(120);
  options.device = torch::cuda::is_available() ? parallel::Device::CUDA : parallel::Device::CPU;
  options.backend_at_world_one = true;  // NCCL itself at world size 1 (the one GPU), not the local identities
  group_slot() = dist::ProcessGroup::init(dist::read_dist_env(dist::process_env_lookup()), options);
  if (torch::cuda::is_available()) {
    at::globalContext().setAllowTF32CuBLAS(false);  // float32 products as on the CPU reference
    at::globalContext().setAllowTF32CuDNN(false);
  }
  return shardtrain::testing::skipped_or(RUN_ALL_TESTS());
}
