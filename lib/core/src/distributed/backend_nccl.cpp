#include "distributed/backends.h"

#include <stdexcept>

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace shardtrain::dist {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, int device_index) {
#ifdef USE_C10D_NCCL
  const int devices = static_cast<int>(c10::cuda::device_count());
  if (device_index < 0 || device_index >= devices) {
    throw std::invalid_argument("NCCL backend: CUDA device " + std::to_string(device_index) + " requested but " +
                                std::to_string(devices) + " CUDA device(s) are visible");
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/false);
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)device_index;
  throw std::runtime_error("NCCL backend requested but this build of LibTorch has no NCCL (USE_C10D_NCCL unset)");
#endif
}

}  // namespace shardtrain::dist
