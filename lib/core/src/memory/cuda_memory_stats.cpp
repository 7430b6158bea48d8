#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>
#include <string>

#include "cuda/entry_points.h"
#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::memory {
namespace {

c10::DeviceAllocator& cuda_allocator(int device) {
  cuda::entry_points();  // LibTorch's CUDA part loaded (once): the allocator below is its
  const bool available = c10::impl::hasDeviceGuardImpl(c10::kCUDA) &&
                         c10::impl::getDeviceGuardImpl(c10::kCUDA)->deviceCount() > device && device >= 0;
  if (!available) {
    throw std::runtime_error("CUDA memory statistics for device " + std::to_string(device) +
                             ": no such CUDA device is available in this process");
  }
  // The caching allocator's per-device state exists only once CUDA is initialised, which the first tensor on the
  // device does; the trainer resets the peak and sets its limit before any ("Allocator not initialized for device"
  // on the GPU, 2026-11-28). Idempotent and cheap after the first call.
  at::globalContext().lazyInitDevice(c10::kCUDA);
  return *c10::getDeviceAllocator(c10::kCUDA);
}

}  // namespace

MemoryStats cuda_memory_stats(int device) {
  auto stats = cuda_allocator(device).getDeviceStats(static_cast<c10::DeviceIndex>(device));
  // Index 0 of each StatArray aggregates all pool types (small and large).
  const auto& allocated = stats.allocated_bytes[0];
  return MemoryStats{allocated.current, allocated.peak, stats.allocation[0].allocated};
}

int64_t cuda_total_memory(int device) {
  return static_cast<int64_t>(cuda_allocator(device).getMemoryInfo(static_cast<c10::DeviceIndex>(device)).second);
}

void set_cuda_memory_limit(int device, int64_t bytes) {
  const int64_t total = cuda_total_memory(device);
  if (bytes <= 0 || bytes > total) {
    throw std::invalid_argument("train.memory_limit: " + std::to_string(bytes) + " bytes on cuda:" +
                                std::to_string(device) + ", expected more than 0 and at most the device's " +
                                std::to_string(total));
  }
  cuda::entry_points().set_memory_fraction(static_cast<double>(bytes) / static_cast<double>(total), device);
}

void reset_cuda_peak(int device) { cuda_allocator(device).resetPeakStats(static_cast<c10::DeviceIndex>(device)); }

}  // namespace shardtrain::memory
