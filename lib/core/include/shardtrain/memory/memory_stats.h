// Per-rank memory accounting, measured by the project itself: on CPU a counting allocator placed in front of c10's
// CPU allocator, on CUDA the caching allocator's own statistics. Bytes are what tensors asked for (allocator
// rounding and the caching allocator's reserve are not counted); `current` is live now, `peak` the most live at
// once since the last reset.
#pragma once

#include <cstdint>

namespace shardtrain::memory {

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // allocations made since the counter was installed (CPU) or the stats were reset (CUDA)
};

// Where the counter files a CPU allocation. A machine computing on its CPU has no second memory to offload to, so
// what offloading puts in host memory (CPU offload's shards, their gradients, the optimizer step's state and
// temporaries) is counted apart, as HOST: COMPUTE's peak is then what a GPU would hold and HOST what its host
// memory would, and offloading runs the copies it runs on a GPU. Each tier has its own counts and peak.
enum class CpuTier { COMPUTE, HOST };

// Files the CPU allocations this thread makes while it lives under `tier` (scopes nest; a free is counted against
// the tier its allocation was made in).
class CpuTierScope {
 public:
  explicit CpuTierScope(CpuTier tier);
  ~CpuTierScope();
  CpuTierScope(const CpuTierScope&) = delete;
  CpuTierScope& operator=(const CpuTierScope&) = delete;

 private:
  CpuTier previous_;
};

// Installs the counting CPU allocator through c10::SetCPUAllocator. Only tensors allocated after installation are
// counted. Process-wide by nature: c10 keeps one CPU allocator per process, and the counter must outlive every
// tensor it allocated, so it is never uninstalled. Idempotent and thread-safe.
void install_cpu_memory_counter();
bool cpu_memory_counter_installed();

// One tier's counts (COMPUTE unless said: all of them where nothing is offloaded). Throws std::logic_error when
// the counter is not installed (rather than reporting zeros that look like data).
MemoryStats cpu_memory_stats(CpuTier tier = CpuTier::COMPUTE);
void reset_cpu_peak();  // peak := current, in both tiers
// A hard limit on the bytes this process's counted CPU tensors of the COMPUTE tier hold at once (0: none), as a
// device's memory is limited and its host's is not: an allocation that would go above it throws
// c10::OutOfMemoryError naming both, as a full GPU's allocator does (train.memory_limit). Like the counter,
// process-wide; throws std::logic_error when the counter is not installed.
void set_cpu_memory_limit(int64_t bytes);

// The CUDA caching allocator's allocated-bytes statistics for `device`. Throws std::runtime_error naming the
// device when CUDA is not available (this build always compiles the path; it runs on a machine with a GPU).
MemoryStats cuda_memory_stats(int device);
void reset_cuda_peak(int device);
// The device's total memory in bytes (what train.batch_size: auto budgets with by default). Same errors.
int64_t cuda_total_memory(int device);
// Caps the caching allocator on `device` at `bytes` (as a fraction of the total: torch.cuda.
// set_per_process_memory_fraction); allocations beyond it throw c10::OutOfMemoryError. Same errors, and
// std::invalid_argument when `bytes` is not in (0, total].
void set_cuda_memory_limit(int device, int64_t bytes);

}  // namespace shardtrain::memory
