// The optimizer step on the CPU, as CPU offload runs it: a shard of N float32 parameters (default 100M) in
// FSDP-sized tensors, LibTorch's AdamW against optim::FusedAdamW, both against the memory-bandwidth bound measured
// in the same run. An AdamW step must read the parameters, gradients and both moments and write back the
// parameters and moments: 28 bytes per parameter; the bound is those bytes over the bandwidth of a large copy
// (8 bytes per float moved) or of a sum of two tensors (12).
//
// AnyPrecision AdamW in pure bf16 with Kahan summation, its fused step against its per-operation one and its own
// bound (18 bytes per parameter). optim::Adafactor's step on the same shard as matrices of 1000 columns (its
// factored statistics need two dimensions). Then the memory a parameter costs after a step (weights, gradient,
// optimizer state), counted by our allocator: float32 weights with AdamW, pure bf16 with AnyPrecision AdamW and
// Kahan summation, float32 with Adafactor.
//
// --device cuda runs the same on the GPU (the steps timed to a device synchronisation, the bandwidth that of a
// device copy, the memory the caching allocator's): LibTorch's AdamW (a kernel per operation and tensor) against
// FusedAdamW's CUDA kernel, AnyPrecision AdamW per operation against its multi-tensor step.
//
//   build/optimizer_bench [--params N] [--tensor-size M] [--steps S] [--device cpu|cuda]
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/anyprecision_adamw.h"
#include "shardtrain/optim/fused_adamw.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Waits for the device's queued kernels (nothing to wait for on the CPU).
void sync(at::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// The least seconds of `steps` runs of `f` after one warm-up run, each to the device's last kernel.
template <typename F>
double best_of(int steps, at::Device device, F&& f) {
  f();
  sync(device);
  double best = 1e30;
  for (int i = 0; i < steps; ++i) {
    const double t0 = now();
    f();
    sync(device);
    best = std::min(best, now() - t0);
  }
  return best;
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return fallback;
}

int64_t arg(int argc, char** argv, const std::string& name, int64_t fallback) {
  const std::string v = arg(argc, argv, name, std::string());
  return v.empty() ? fallback : std::atoll(v.c_str());
}

// Bytes live on the benchmark's device: our CPU allocator's count, or the CUDA caching allocator's.
int64_t live_bytes(at::Device device) {
  if (device.is_cuda()) return shardtrain::memory::cuda_memory_stats(device.index()).current_bytes;
  return shardtrain::memory::cpu_memory_stats().current_bytes;
}

constexpr int64_t kColumns = 1000;  // Adafactor's matrices

// `n` parameters in tensors of `per_tensor`, each with a gradient; `matrices`: as (rows, kColumns) where they divide.
std::vector<at::Tensor> make_shard(int64_t n, int64_t per_tensor, at::Device device,
                                   at::ScalarType dtype = at::kFloat, bool matrices = false) {
  std::vector<at::Tensor> params;
  torch::manual_seed(0);
  for (int64_t done = 0; done < n; done += per_tensor) {
    const int64_t size = std::min(per_tensor, n - done);
    at::Tensor p = torch::randn({size}).to(device, dtype);
    if (matrices && size % kColumns == 0) p = p.view({size / kColumns, kColumns});
    p.requires_grad_();
    p.mutable_grad() = torch::randn(p.sizes()).to(p.options());
    params.push_back(p);
  }
  return params;
}

enum class Kind { ADAMW, ANYPRECISION, ADAFACTOR };

// Bytes per parameter held after one step: the weights, their gradients and the optimizer's state.
double bytes_per_parameter(int64_t n, at::Device device, at::ScalarType dtype, Kind kind) {
  sync(device);
  const int64_t before = live_bytes(device);
  std::vector<at::Tensor> params = make_shard(n, n, device, dtype, kind == Kind::ADAFACTOR);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == Kind::ANYPRECISION) {
    opt = std::make_unique<shardtrain::optim::AnyPrecisionAdamW>(
        params, shardtrain::optim::AnyPrecisionAdamWOptions(1e-4).use_kahan_summation(true));
  } else if (kind == Kind::ADAFACTOR) {
    opt = std::make_unique<shardtrain::optim::Adafactor>(
        params, shardtrain::optim::AdafactorOptions(1e-4).relative_step(false));
  } else {
    opt = std::make_unique<shardtrain::optim::FusedAdamW>(params, torch::optim::AdamWOptions(1e-4));
  }
  opt->step();
  sync(device);
  return static_cast<double>(live_bytes(device) - before) / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = arg(argc, argv, "params", 100'000'000);
  const int64_t per_tensor = arg(argc, argv, "tensor-size", 7'000'000);  // about one FLAVA-350m layer's shard
  const int steps = static_cast<int>(arg(argc, argv, "steps", 3));
  const std::string device = arg(argc, argv, "device", std::string("cpu"));
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "optimizer_bench: --device '%s' is not cpu or cuda\n", device.c_str());
    return 2;
  }
  if (device == "cuda" && shardtrain::cuda::load_cuda() == 0) {
    std::fprintf(stderr, "optimizer_bench: --device cuda, but this machine has no CUDA device\n");
    return 2;
  }
  const at::Device dev = device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  if (dev.is_cuda()) {
    std::printf("optimizer step on %lld float32 parameters in tensors of %lld, on cuda:0\n",
                static_cast<long long>(n), static_cast<long long>(per_tensor));
  } else {
    std::printf("optimizer step on %lld float32 parameters in tensors of %lld, %d threads\n",
                static_cast<long long>(n), static_cast<long long>(per_tensor), at::get_num_threads());
  }

  // The bandwidth: the better of a copy (8 B per element read and written) and a sum of two tensors (12 B), both
  // multi-threaded and vectorised by ATen (on the GPU: one kernel each).
  const auto on_device = at::TensorOptions().device(dev);
  at::Tensor a = torch::randn({n}, on_device), b = torch::randn({n}, on_device), out = torch::empty({n}, on_device);
  const double copy = best_of(steps, dev, [&] { out.copy_(a); });
  const double add = best_of(steps, dev, [&] { at::add_out(out, a, b); });
  const double bandwidth = std::max(8.0 * static_cast<double>(n) / copy, 12.0 * static_cast<double>(n) / add);
  const double bound = 28.0 * static_cast<double>(n) / bandwidth;
  a = b = out = at::Tensor();
  std::printf("  memory bandwidth    %6.2f GB/s (copy %.2f, sum %.2f); AdamW's bound: 28 B x N = %.3f s\n",
              bandwidth / 1e9, 8.0 * static_cast<double>(n) / copy / 1e9, 12.0 * static_cast<double>(n) / add / 1e9,
              bound);

  const auto options = torch::optim::AdamWOptions(1e-4).weight_decay(0.01);
  double seconds[2];
  for (int fused = 0; fused < 2; ++fused) {
    std::vector<at::Tensor> params = make_shard(n, per_tensor, dev);
    std::unique_ptr<torch::optim::AdamW> opt =
        fused ? std::make_unique<shardtrain::optim::FusedAdamW>(params, options)
              : std::make_unique<torch::optim::AdamW>(params, options);
    seconds[fused] = best_of(steps, dev, [&] { opt->step(); });
    std::printf("  %-19s %.3f s a step: %.2fx the bound\n", fused ? "optim::FusedAdamW" : "torch::optim::AdamW",
                seconds[fused], seconds[fused] / bound);
  }
  std::printf("fused / LibTorch: %.2fx faster; fused / bound: %.2fx\n", seconds[0] / seconds[1], seconds[1] / bound);
  {
    // Pure bf16: an AnyPrecision step with Kahan summation reads the weights, gradients, moments and compensation
    // (5 x 2 B) and writes all but the gradients back (4 x 2 B).
    const double any_bound = 18.0 * static_cast<double>(n) / bandwidth;
    std::printf("  AnyPrecision AdamW on bf16 weights, moments and compensation (Kahan); "
                "its bound: 18 B x N = %.3f s\n", any_bound);
    double any[2];
    for (int fused = 0; fused < 2; ++fused) {
      std::vector<at::Tensor> params = make_shard(n, per_tensor, dev, at::kBFloat16);
      shardtrain::optim::AnyPrecisionAdamW opt(params, shardtrain::optim::AnyPrecisionAdamWOptions(1e-4)
                                                           .weight_decay(0.01)
                                                           .use_kahan_summation(true)
                                                           .fused(fused != 0));
      any[fused] = best_of(steps, dev, [&] { opt.step(); });
      const char* kind = !fused ? "per operation" : dev.is_cuda() ? "multi-tensor" : "fused";
      std::printf("    %-17s %.3f s a step: %.2fx the bound\n", kind, any[fused], any[fused] / any_bound);
    }
    std::printf("  AnyPrecision fused / per operation: %.2fx faster; fused / bound: %.2fx\n", any[0] / any[1],
                any[1] / any_bound);
  }
  {
    std::vector<at::Tensor> params = make_shard(n, per_tensor, dev, at::kFloat, /*matrices=*/true);
    shardtrain::optim::Adafactor opt(params, shardtrain::optim::AdafactorOptions(1e-4).relative_step(false));
    const double t = best_of(steps, dev, [&] { opt.step(); });
    std::printf("  %-19s %.3f s a step (matrices of %lld columns): %.2fx optim::FusedAdamW's time\n",
                "optim::Adafactor", t, static_cast<long long>(kColumns), t / seconds[1]);
  }

  if (!dev.is_cuda()) shardtrain::memory::install_cpu_memory_counter();
  const int64_t m = std::min<int64_t>(n, 10'000'000);
  std::printf("memory per parameter after a step (%lld parameters, counted by %s):\n", static_cast<long long>(m),
              dev.is_cuda() ? "the CUDA caching allocator" : "our allocator");
  std::printf("  float32 weights, AdamW                          %5.2f B (4 weight + 4 gradient + 4 + 4 moments)\n",
              bytes_per_parameter(m, dev, at::kFloat, Kind::ADAMW));
  std::printf("  bf16 weights, AnyPrecision AdamW with Kahan     %5.2f B (2 + 2 + 2 + 2 moments + 2 compensation)\n",
              bytes_per_parameter(m, dev, at::kBFloat16, Kind::ANYPRECISION));
  std::printf("  float32 weights, Adafactor                      %5.2f B (4 + 4 + the statistics' rows, columns)\n",
              bytes_per_parameter(m, dev, at::kFloat, Kind::ADAFACTOR));
  return 0;
}
