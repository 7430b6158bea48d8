// The disk tier's optimizer step (parallel.offload: nvme, optim::DiskAdamW) against the disk's own bandwidth,
// measured in the same run, and against CPU offload's step (optim::FusedAdamW with its state in host memory). A
// step must read and write both moments: 8 bytes a float32 parameter each way. The bound is those bytes over the
// disk's bandwidth for the step's own transfers without its computation (io::ScratchFile, O_DIRECT, a chunk per
// request, the next chunk read while the last is written; writing alone, reading alone and both over separate
// halves printed beside): the step's share of it is the figure of merit (the goal: 70%), what the
// computation and the staging cost on top of the disk.
//
//   build/disk_bench --dir DIR [--params N] [--tensor-size M] [--steps S] [--chunk-mib C]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "shardtrain/io/scratch_file.h"
#include "shardtrain/optim/disk_adamw.h"
#include "shardtrain/optim/fused_adamw.h"

namespace {

using namespace shardtrain;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The disk's bandwidth over `bytes` in `request`-sized transfers, `depth` in flight: writing, reading, and both at
// once (reading one half while writing the other), and in the step's own order, each in GB/s of bytes moved.
struct Bandwidth {
  double write = 0, read = 0, mixed = 0, step_pattern = 0;
};

Bandwidth disk_bandwidth(const std::string& dir, int64_t bytes, int64_t request, int depth) {
  bytes = (bytes + 2 * request - 1) / (2 * request) * (2 * request);
  io::ScratchFile f = io::ScratchFile::create(dir, "disk-bench", bytes);
  std::vector<io::AlignedBuffer> buffers;
  for (int i = 0; i < depth; ++i) buffers.emplace_back(request);
  // Transfer k of the pass: a write or a read at its offset.
  auto pass = [&](auto&& transfer) {
    const double t0 = now();
    std::vector<uint64_t> tickets(static_cast<size_t>(depth), 0);
    for (int64_t k = 0; k * request < bytes; ++k) {
      const size_t slot = static_cast<size_t>(k % depth);
      if (tickets[slot] != 0) f.wait(tickets[slot]);
      tickets[slot] = transfer(k, buffers[slot].data());
    }
    f.wait_all();
    return static_cast<double>(bytes) / (now() - t0) / 1e9;
  };
  // The best of three passes each, as the step's time is the best of its steps (a disk, or a virtual one's host,
  // caches as it pleases).
  Bandwidth b;
  const int64_t half = bytes / 2;  // mixed: even transfers read the first half, odd ones write the second
  for (int repeat = 0; repeat < 3; ++repeat) {
    b.write = std::max(b.write, pass([&](int64_t k, char* buffer) { return f.write(buffer, request, k * request); }));
    b.read = std::max(b.read, pass([&](int64_t k, char* buffer) { return f.read(buffer, request, k * request); }));
    b.mixed = std::max(b.mixed, pass([&](int64_t k, char* buffer) {
      const int64_t offset = (k / 2) * request;
      return k % 2 == 0 ? f.read(buffer, request, offset) : f.write(buffer, request, half + offset);
    }));
  }
  // The step's own pattern without its computation: chunk k + 1 read into one buffer while chunk k is written from
  // the other, over the whole file (the state's size), read and written in place.
  for (int repeat = 0; repeat < 3; ++repeat) {
    const double t0 = now();
    uint64_t reading = f.read(buffers[0].data(), request, 0), writing = 0;
    for (int64_t k = 0; k * request < bytes; ++k) {
      f.wait(reading);
      if (writing != 0) f.wait(writing);
      if ((k + 1) * request < bytes) reading = f.read(buffers[(k + 1) % 2].data(), request, (k + 1) * request);
      writing = f.write(buffers[k % 2].data(), request, k * request);
    }
    f.wait_all();
    b.step_pattern = std::max(b.step_pattern, 2.0 * static_cast<double>(bytes) / (now() - t0) / 1e9);
  }
  std::printf("disk: %s, %.2f GB: written at %.2f GB/s, read at %.2f GB/s, both at once %.2f GB/s, the step's "
              "pattern (read ahead, write behind) %.2f GB/s (%s, %lld MiB requests, %d in flight)\n",
              dir.c_str(), static_cast<double>(bytes) / 1e9, b.write, b.read, b.mixed, b.step_pattern,
              f.direct() ? "O_DIRECT" : "buffered", static_cast<long long>(request >> 20), depth);
  return b;
}

std::vector<at::Tensor> shard(int64_t params, int64_t tensor_size) {
  torch::manual_seed(0);
  std::vector<at::Tensor> out;
  for (int64_t left = params; left > 0; left -= tensor_size) {
    out.push_back(torch::randn({std::min(left, tensor_size)}).requires_grad_(true));
    out.back().mutable_grad() = torch::randn_like(out.back());
  }
  return out;
}

int run(int argc, char** argv) {
  std::string dir;
  int64_t params = 50'000'000, tensor_size = 4'000'000, steps = 3, chunk_mib = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--dir") dir = next();
    else if (a == "--params") params = std::stoll(next());
    else if (a == "--tensor-size") tensor_size = std::stoll(next());
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--chunk-mib") chunk_mib = std::stoll(next());
    else throw std::invalid_argument("unknown option " + a + " (usage: disk_bench --dir DIR [--params N] "
                                     "[--tensor-size M] [--steps S] [--chunk-mib C])");
  }
  if (dir.empty()) throw std::invalid_argument("--dir DIR: a directory on the disk to measure");
  at::set_num_threads(std::max(1, at::get_num_threads()));
  const int64_t moment_bytes = params * 4;
  const Bandwidth disk_gbps = disk_bandwidth(dir, 2 * moment_bytes, chunk_mib << 20, 2);
  // Both moments read and written, at the disk's rate for the step's own pattern of transfers.
  const double bound = 4.0 * static_cast<double>(moment_bytes) / 1e9 / disk_gbps.step_pattern;

  auto on_disk = shard(params, tensor_size), in_memory = shard(params, tensor_size);
  std::vector<torch::optim::OptimizerParamGroup> g1, g2;
  g1.emplace_back(on_disk, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  g2.emplace_back(in_memory, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  optim::DiskAdamW disk(std::move(g1), torch::optim::AdamWOptions(), {dir, "disk-bench-state", chunk_mib << 20});
  optim::FusedAdamW fused(std::move(g2), torch::optim::AdamWOptions());
  double disk_best = 1e30, fused_best = 1e30, wait = 0, compute = 0;
  for (int64_t s = 0; s <= steps; ++s) {  // the first of each is the state's creation, not timed
    const double t0 = now();
    fused.step();
    if (s > 0) fused_best = std::min(fused_best, now() - t0);
    disk.step();
    if (s > 0 && disk.last_step().seconds < disk_best) {
      disk_best = disk.last_step().seconds, wait = disk.last_step().io_wait_s, compute = disk.last_step().compute_s;
    }
  }
  bool equal = true;
  for (size_t i = 0; i < on_disk.size(); ++i) equal = equal && torch::equal(on_disk[i], in_memory[i]);
  std::printf("AdamW step on %lld float32 parameters (%.2f GB of moments each way), best of %lld:\n",
              static_cast<long long>(params), 2.0 * static_cast<double>(moment_bytes) / 1e9,
              static_cast<long long>(steps));
  std::printf("  disk tier (DiskAdamW, %lld MiB chunks): %.3f s (waiting for the disk %.3f s, computing %.3f s; "
              "%.2f GB read and written in %lld chunks)\n",
              static_cast<long long>(chunk_mib), disk_best, wait, compute,
              static_cast<double>(disk.last_step().bytes_read) / 1e9, static_cast<long long>(disk.last_step().chunks));
  std::printf("  the disk's bound (both moments read and written in the step's order, no computation): %.3f s: the "
              "step reaches %.0f%% of the disk's bandwidth\n", bound, 100 * bound / disk_best);
  std::printf("  CPU offload's step (FusedAdamW, state in host memory): %.3f s; the disk tier %.1fx its time\n",
              fused_best, disk_best / fused_best);
  std::printf("  parameters after the steps: %s\n", equal ? "equal to the bit" : "DIFFER");
  return equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "disk_bench: %s\n", e.what());
    return 2;
  }
}
