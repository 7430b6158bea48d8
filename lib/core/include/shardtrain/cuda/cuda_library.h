// LibTorch's CUDA backend (libtorch_cuda, the CUDA runtime, NCCL) is loaded into a process only when the process
// asks for a CUDA device. The library and its programs link LibTorch's CPU part alone; libshardtrain_cuda.so, which
// links the CUDA part and holds the calls that need it at link time (NCCL's process group, the caching allocator's
// memory fraction, device properties), is opened on first use. A process that never touches a GPU neither pays the
// CUDA libraries' loading (0.15 s of every process's 0.38 s of LibTorch on the 2-core development machine) nor needs
// them installed.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::cuda {

// Loads the CUDA backend into this process, once (later calls return at once), and returns the number of visible
// CUDA devices: 0 on a machine without a GPU or driver. The trainer, the process group and the CUDA memory
// statistics call it themselves; a program of its own calls it before asking LibTorch anything about CUDA
// (torch::cuda::is_available(), at::hasCUDA(), torch::manual_seed), because LibTorch settles at its first such
// question whether this process has CUDA, for good. A program that links LibTorch's torch_cuda itself has it
// already, and this only opens libshardtrain_cuda.so.
//
// Where: $SHARDTRAIN_CUDA_LIBRARY when set (a path to the file); otherwise beside the running program, in its
// ../lib, in the build tree that built this library, in the prefix it installs to. Throws std::runtime_error naming
// what failed: not found (every path tried), not loadable (the dynamic loader's reason), or CUDA asked about first.
int load_cuda();

// The GPUs this process sees: 0 without loading anything on a machine without NVIDIA's driver (no
// /proc/driver/nvidia/gpus entry, no /dev/nvidiactl), else load_cuda()'s count.
int visible_gpus();

// What a run computes on: `requested` itself, or for Device::AUTO, CUDA when visible_gpus() finds one and the CPU
// otherwise.
parallel::Device resolve_device(parallel::Device requested);

struct DeviceProperties {
  std::string name;         // "NVIDIA H200"
  int64_t total_bytes = 0;  // the device's memory
  int major = 0;            // compute capability major.minor
  int minor = 0;
};

// What `shardtrain env` reports, each loading the backend first (load_cuda's errors). A device that is not visible
// is a std::invalid_argument naming it.
DeviceProperties device_properties(int device);
uint64_t nccl_version();  // the NCCL LibTorch's CUDA part carries: major << 32 | minor << 16 | patch

}  // namespace shardtrain::cuda
