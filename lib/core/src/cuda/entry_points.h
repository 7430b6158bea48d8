// The calls libshardtrain_cuda.so provides (shardtrain/cuda/cuda_library.h): those that need LibTorch's CUDA part
// at link time. Everything else on a GPU (tensors, streams, the caching allocator's statistics, CUDA's random
// generators) goes through LibTorch's CPU part once the library is loaded. Private to core; the loader and the
// library are built from the same tree, and the version below catches a library from another.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>

#include "shardtrain/cuda/cuda_library.h"

namespace shardtrain::cuda {

constexpr int kEntryPointsVersion = 1;

struct EntryPoints {
  int version = kEntryPointsVersion;
  // NCCL on CUDA device `device_index` (made current first). Throws std::invalid_argument naming the device when
  // it is not visible.
  c10::intrusive_ptr<c10d::Backend> (*make_nccl_backend)(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size, std::chrono::milliseconds timeout,
                                                         int device_index) = nullptr;
  // The caching allocator's cap on `device`, as a fraction of its memory (torch.cuda.set_per_process_memory_fraction).
  void (*set_memory_fraction)(double fraction, int device) = nullptr;
  uint64_t (*nccl_version)() = nullptr;
  DeviceProperties (*device_properties)(int device) = nullptr;
};

// The library's entry points, loading it first (load_cuda's search and errors).
const EntryPoints& entry_points();

}  // namespace shardtrain::cuda

// What the library exports, by this unmangled name.
extern "C" const shardtrain::cuda::EntryPoints* shardtrain_cuda_entry_points();
