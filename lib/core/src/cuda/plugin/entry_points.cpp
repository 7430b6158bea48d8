// libshardtrain_cuda.so: the entry points that link LibTorch's CUDA part (cuda/entry_points.h). Built into a
// library of its own, opened by cuda/cuda_library.cpp when a process asks for a CUDA device.
#include "cuda/entry_points.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/nccl.h>

#include <stdexcept>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace shardtrain::cuda {
namespace {

void check_visible(int device, const char* what) {
  const int devices = static_cast<int>(c10::cuda::device_count());
  if (device < 0 || device >= devices) {
    throw std::invalid_argument(std::string(what) + ": CUDA device " + std::to_string(device) + " requested but " +
                                std::to_string(devices) + " CUDA device(s) are visible");
  }
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, int device_index) {
#ifdef USE_C10D_NCCL
  check_visible(device_index, "NCCL backend");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/false);
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)device_index;
  throw std::runtime_error("NCCL backend requested but this build of LibTorch has no NCCL (USE_C10D_NCCL unset)");
#endif
}

void set_memory_fraction(double fraction, int device) {
  check_visible(device, "CUDA memory limit");
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
}

uint64_t libtorch_nccl_version() { return torch::cuda::nccl::version(); }

DeviceProperties properties_of(int device) {
  check_visible(device, "CUDA device properties");
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  return DeviceProperties{p->name, static_cast<int64_t>(p->totalGlobalMem), p->major, p->minor};
}

}  // namespace
}  // namespace shardtrain::cuda

extern "C" const shardtrain::cuda::EntryPoints* shardtrain_cuda_entry_points() {
  using namespace shardtrain::cuda;
  static const EntryPoints points{kEntryPointsVersion, &make_nccl_backend, &set_memory_fraction,
                                  &libtorch_nccl_version, &properties_of};
  return &points;
}
