// `shardtrain env`: what a bug report needs, as Accelerate's `accelerate env` gives it: shardtrain's and LibTorch's
// versions, the CUDA runtime, cuDNN and NCCL LibTorch runs with, every visible GPU (name, memory, compute
// capability), the CPUs this process may use and the machine's memory, the launcher's variables in effect, and the
// directories shardtrain reads from (the packed-text cache, the Hugging Face cache).
#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <sched.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <torch/headeronly/version.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "commands.h"
#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/data/pipeline/packed_texts.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/io/hf_cache.h"

namespace shardtrain::cli {
namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1 << 30));
  return text;
}

// "9.19.0" from cuDNN's 91900 (its encoding since cuDNN 9).
std::string dotted(long code) {
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." + std::to_string(code % 100);
}

// "2.28.9" from LibTorch's NCCL version: major << 32 | minor << 16 | patch.
std::string nccl_version(uint64_t v) {
  return std::to_string(v >> 32) + "." + std::to_string((v >> 16) & 0xffff) + "." + std::to_string(v & 0xffff);
}

const char* source_name(dist::EnvSource s) {
  switch (s) {
    case dist::EnvSource::NONE: return "none (one process)";
    case dist::EnvSource::TORCHRUN: return "torchrun's variables (RANK, WORLD_SIZE, ...)";
    case dist::EnvSource::SLURM: return "Slurm's (SLURM_PROCID, SLURM_NTASKS, ...)";
    case dist::EnvSource::MPI: return "Open MPI's (OMPI_COMM_WORLD_RANK, ...)";
  }
  return "?";
}

}  // namespace

int run_env_command(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::cout << "usage: shardtrain env   (no options: prints the versions, devices and settings a bug report needs)\n";
    return args[0] == "--help" || args[0] == "-h" ? 0 : 2;
  }
  utsname u{};
  ::uname(&u);
  std::cout << "shardtrain: " << SHARDTRAIN_VERSION << "\n"
            << "platform: " << u.sysname << " " << u.release << " " << u.machine << "\n"
            << "LibTorch: " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH
            << " (CPU capability " << at::get_cpu_capability() << ")\n";
  int gpus = 0;
  try {  // what LibTorch was built with; read without a GPU
    gpus = cuda::load_cuda();
    const long runtime = at::detail::getCUDAHooks().versionCUDART();  // 13000: 13.0
    std::cout << "CUDA: runtime " << runtime / 1000 << "." << runtime % 1000 / 10 << ", cuDNN "
              << dotted(at::detail::getCUDAHooks().versionCuDNN()) << ", NCCL "
              << nccl_version(cuda::nccl_version()) << "\n";
  } catch (const std::exception& e) {
    std::cout << "CUDA: not available (" << e.what() << ")\n";
  }
  std::cout << "GPUs: " << gpus << (gpus == 0 ? " (none visible: no GPU, no driver or CUDA_VISIBLE_DEVICES)" : "")
            << "\n";
  for (int i = 0; i < gpus; ++i) {
    const cuda::DeviceProperties p = cuda::device_properties(i);
    std::cout << "  cuda:" << i << "  " << p.name << "  " << gib(static_cast<double>(p.total_bytes))
              << "  compute capability " << p.major << "." << p.minor << "\n";
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  struct sysinfo info {};
  ::sysinfo(&info);
  std::cout << "CPUs: " << std::thread::hardware_concurrency() << " (" << usable << " usable by this process), "
            << at::get_num_threads() << " intra-op threads\n"
            << "memory: " << gib(static_cast<double>(info.totalram) * info.mem_unit) << " ("
            << gib(static_cast<double>(info.freeram) * info.mem_unit) << " free)\n";
  std::cout << "launcher: ";
  try {
    const dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
    std::cout << source_name(env.source);
    if (env.source != dist::EnvSource::NONE) {
      std::cout << ", rank " << env.rank << " of " << env.world_size << ", local " << env.local_rank << " of "
                << env.local_world_size << ", master " << env.master_addr << ":" << env.master_port;
    }
  } catch (const std::exception& e) {  // what a worker started here would stop with
    std::cout << "unusable: " << e.what();
  }
  std::cout << "\n"
            << "packed-text cache: " << data::default_cache_dir() << "\n"
            << "Hugging Face cache: " << io::hf_hub_cache_dir() << "\n";
  return 0;
}

}  // namespace shardtrain::cli
