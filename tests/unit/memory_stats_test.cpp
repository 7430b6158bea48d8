// The counting CPU allocator: exact byte counts for tensors allocated and freed, the peak, and the reset, in each
// tier; the CUDA statistics path fails clearly without a GPU.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/memory/memory_stats.h"
#include "support/expect_error.h"

namespace shardtrain::memory {
namespace {

TEST(MemoryStats, CountsWhatTensorsAllocateAndFree) {
  install_cpu_memory_counter();
  install_cpu_memory_counter();  // idempotent
  ASSERT_TRUE(cpu_memory_counter_installed());
  const MemoryStats before = cpu_memory_stats();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);   // 4000 bytes
    at::Tensor b = at::empty({250}, at::kDouble);   // 2000 bytes
    const MemoryStats during = cpu_memory_stats();
    EXPECT_EQ(during.current_bytes - before.current_bytes, 6000);
    EXPECT_EQ(during.allocations - before.allocations, 2);
    at::Tensor view = a.narrow(0, 10, 20);  // a view allocates nothing
    EXPECT_EQ(cpu_memory_stats().current_bytes, during.current_bytes);
  }
  EXPECT_EQ(cpu_memory_stats().current_bytes, before.current_bytes);
}

// Some kernels (bf16 GELU among them) allocate scratch through Allocator::raw_allocate, which requires a DataPtr
// whose context is its data pointer, and free it through raw_deleter().
TEST(MemoryStats, RawAllocateAndKernelsThatUseIt) {
  install_cpu_memory_counter();
  const MemoryStats before = cpu_memory_stats();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* p = allocator->raw_allocate(512);
  EXPECT_EQ(cpu_memory_stats().current_bytes - before.current_bytes, 512);
  allocator->raw_deallocate(p);
  EXPECT_EQ(cpu_memory_stats().current_bytes, before.current_bytes);
  at::Tensor x = at::randn({64, 64}).to(at::kBFloat16);
  EXPECT_EQ(at::gelu(x).sizes(), x.sizes());
}

TEST(MemoryStats, PeakAndReset) {
  install_cpu_memory_counter();
  reset_cpu_peak();
  const int64_t base = cpu_memory_stats().current_bytes;
  EXPECT_EQ(cpu_memory_stats().peak_bytes, base);
  { at::Tensor big = at::empty({1 << 20}, at::kFloat); }  // 4 MiB, freed at once
  { at::Tensor small = at::empty({1 << 10}, at::kFloat); }
  EXPECT_EQ(cpu_memory_stats().peak_bytes - base, 4 << 20);
  EXPECT_EQ(cpu_memory_stats().current_bytes, base);
  reset_cpu_peak();
  EXPECT_EQ(cpu_memory_stats().peak_bytes, base);
}

TEST(MemoryStats, CountsAcrossThreads) {
  install_cpu_memory_counter();
  const int64_t base = cpu_memory_stats().current_bytes;
  std::vector<std::thread> threads;
  std::vector<at::Tensor> kept(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&kept, t] {
      for (int i = 0; i < 200; ++i) at::empty({100 + i}, at::kFloat);
      kept[t] = at::empty({1024}, at::kByte);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(cpu_memory_stats().current_bytes - base, 4 * 1024);
  kept.clear();
  EXPECT_EQ(cpu_memory_stats().current_bytes, base);
}

// train.memory_limit on CPU: an allocation that would pass the limit fails as a full GPU's does
// (c10::OutOfMemoryError, naming the sizes), counts nothing, and what fits still allocates; 0 lifts the limit.
TEST(MemoryStats, LimitRefusesWhatWouldPassIt) {
  install_cpu_memory_counter();
  struct Lift {  // the counter is the process's: no other test may see the limit
    ~Lift() { set_cpu_memory_limit(0); }
  } lift;
  const int64_t base = cpu_memory_stats().current_bytes;
  set_cpu_memory_limit(base + (8 << 20));  // 8 MiB above what is held
  at::Tensor fits = at::empty({1 << 20}, at::kFloat);  // 4 MiB
  const int64_t allocations = cpu_memory_stats().allocations;
  testing::expect_error<c10::OutOfMemoryError>([] { at::empty({(1 << 20) + 1}, at::kFloat); },
                                               {"CPU out of memory", "4.00 MiB", "train.memory_limit"});
  EXPECT_EQ(cpu_memory_stats().current_bytes, base + (4 << 20));
  EXPECT_EQ(cpu_memory_stats().allocations, allocations);
  at::Tensor more = at::empty({1 << 20}, at::kFloat);  // up to the limit exactly
  EXPECT_EQ(cpu_memory_stats().current_bytes, base + (8 << 20));
  set_cpu_memory_limit(0);
  at::Tensor beyond = at::empty({1 << 20}, at::kFloat);
  EXPECT_EQ(cpu_memory_stats().current_bytes, base + (12 << 20));
}

// The host tier (what offloading keeps in host memory, counted apart on a CPU): an allocation is filed under the
// tier of its thread's innermost scope and its free counted there, whatever the scope then; each tier has its own
// peak, both reset together; the limit is the compute tier's alone; another thread's allocations are its own tier's.
TEST(MemoryStats, HostTierCountedApart) {
  install_cpu_memory_counter();
  struct Lift {
    ~Lift() { set_cpu_memory_limit(0); }
  } lift;
  reset_cpu_peak();
  const MemoryStats compute0 = cpu_memory_stats(), host0 = cpu_memory_stats(CpuTier::HOST);
  at::Tensor kept_on_host;
  {
    const CpuTierScope host(CpuTier::HOST);
    kept_on_host = at::empty({1000}, at::kFloat);  // 4000 bytes
    {
      const CpuTierScope compute(CpuTier::COMPUTE);
      at::Tensor scratch = at::empty({10}, at::kFloat);  // 40 bytes, freed here
      EXPECT_EQ(cpu_memory_stats().current_bytes - compute0.current_bytes, 40);
    }
    at::Tensor from_other_thread;
    std::thread([&] { from_other_thread = at::empty({100}, at::kFloat); }).join();  // 400 bytes, compute
    EXPECT_EQ(cpu_memory_stats().current_bytes - compute0.current_bytes, 400);
    set_cpu_memory_limit(compute0.current_bytes + 1024);
    at::Tensor beyond_the_limit = at::empty({1 << 20}, at::kFloat);  // the host's: not limited
  }
  EXPECT_EQ(cpu_memory_stats(CpuTier::HOST).current_bytes - host0.current_bytes, 4000);
  EXPECT_EQ(cpu_memory_stats(CpuTier::HOST).peak_bytes - host0.current_bytes, 4000 + (4 << 20));
  EXPECT_EQ(cpu_memory_stats(CpuTier::HOST).allocations - host0.allocations, 2);
  EXPECT_EQ(cpu_memory_stats().current_bytes, compute0.current_bytes);
  EXPECT_EQ(cpu_memory_stats().peak_bytes - compute0.current_bytes, 400);
  testing::expect_error<c10::OutOfMemoryError>([] { at::empty({1 << 20}, at::kFloat); }, {"train.memory_limit"});
  set_cpu_memory_limit(0);
  kept_on_host = at::Tensor();  // freed outside any scope: still the host's
  EXPECT_EQ(cpu_memory_stats(CpuTier::HOST).current_bytes, host0.current_bytes);
  reset_cpu_peak();
  EXPECT_EQ(cpu_memory_stats(CpuTier::HOST).peak_bytes, host0.current_bytes);
}

TEST(MemoryStats, CudaWithoutDeviceIsAClearError) {
  if (cuda::load_cuda() > 0) GTEST_SKIP() << "a GPU is present";
  testing::expect_error<std::runtime_error>([] { cuda_memory_stats(0); }, {"device 0"});
}

}  // namespace
}  // namespace shardtrain::memory
