#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::memory {
namespace {

class CountingCpuAllocator;
CountingCpuAllocator* installed_counter();

// Wraps the allocator that was installed before it. The DataPtr it returns has the data pointer as its context
// (c10::Allocator::raw_allocate, used by some kernels, requires it); the original DataPtr and the size wait in a
// table keyed by that pointer until the free, which is counted and then handed to the original deleter.
// The tier this thread files its allocations under (CpuTierScope): thread-local because the allocation sites are
// deep inside ATen, which takes no argument for it.
thread_local CpuTier current_tier = CpuTier::COMPUTE;

// One tier's counts. The limit (COMPUTE only) is checked as bytes are counted, before they exist, so that it holds
// between threads allocating at once.
struct TierCounts {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> limit{0};  // 0: none
};

// Wraps the allocator that was installed before it. The DataPtr it returns has the data pointer as its context
// (c10::Allocator::raw_allocate, used by some kernels, requires it); the original DataPtr, the size and the tier wait
// in a table keyed by that pointer until the free, which is counted and then handed to the original deleter.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    const int64_t n = static_cast<int64_t>(nbytes);
    const CpuTier tier = current_tier;
    TierCounts& counts = tiers_[index(tier)];
    const int64_t held = reserve(counts, n);
    c10::DataPtr inner;
    try {
      inner = base_->allocate(nbytes);
    } catch (...) {
      counts.current.fetch_sub(n);
      throw;
    }
    void* data = inner.get();
    if (data == nullptr) {  // empty allocations: nothing to count, no key to file them under
      counts.current.fetch_sub(n);
      return inner;
    }
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, Record{std::move(inner), n, tier});
    }
    note_peak(counts, held);
    counts.allocations.fetch_add(1);
    return c10::DataPtr(data, data, &CountingCpuAllocator::free_data, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::free_data; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  MemoryStats stats(CpuTier tier) const {
    const TierCounts& counts = tiers_[index(tier)];
    return MemoryStats{counts.current.load(), counts.peak.load(), counts.allocations.load()};
  }
  void reset_peak() {
    for (TierCounts& counts : tiers_) counts.peak.store(counts.current.load());
  }
  void set_limit(int64_t bytes) { tiers_[index(CpuTier::COMPUTE)].limit.store(bytes); }

 private:
  struct Record {
    c10::DataPtr inner;
    int64_t nbytes;
    CpuTier tier;
  };

  static size_t index(CpuTier tier) { return tier == CpuTier::COMPUTE ? 0 : 1; }

  static void free_data(void* data) { installed_counter()->release(data); }

  void release(void* data) {
    Record record;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(data);
      if (it == live_.end()) return;  // not ours: cannot happen, as only our DataPtrs carry this deleter
      record = std::move(it->second);
      live_.erase(it);
    }
    tiers_[index(record.tier)].current.fetch_sub(record.nbytes);
    // record.inner frees the memory through the original deleter as it goes out of scope.
  }

  // Counts `nbytes` as held and returns what is held with them, or throws c10::OutOfMemoryError (nothing counted)
  // when that would pass the tier's limit.
  static int64_t reserve(TierCounts& counts, int64_t nbytes) {
    const int64_t now = counts.current.fetch_add(nbytes) + nbytes, limit = counts.limit.load();
    if (limit > 0 && now > limit) {
      counts.current.fetch_sub(nbytes);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", mib(nbytes), " with ",
                       mib(now - nbytes), " held, above the limit of ", mib(limit), " (train.memory_limit)");
    }
    return now;
  }

  static void note_peak(TierCounts& counts, int64_t now) {
    int64_t peak = counts.peak.load();
    while (now > peak && !counts.peak.compare_exchange_weak(peak, now)) {
    }
  }

  static std::string mib(int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return text;
  }

  c10::Allocator* base_;
  std::mutex mutex_;
  std::unordered_map<void*, Record> live_;
  std::array<TierCounts, 2> tiers_;  // COMPUTE, HOST
};

// The one counter of this process (see the header: c10's CPU allocator slot is itself process-wide). Leaked on
// purpose: tensors freed during static destruction still call into it.
std::atomic<CountingCpuAllocator*> installed{nullptr};
std::mutex install_mutex;

CountingCpuAllocator* installed_counter() { return installed.load(); }

CountingCpuAllocator& counter() {
  CountingCpuAllocator* c = installed.load();
  if (c == nullptr) {
    throw std::logic_error("CPU memory counter is not installed: call install_cpu_memory_counter() first");
  }
  return *c;
}

}  // namespace

CpuTierScope::CpuTierScope(CpuTier tier) : previous_(current_tier) { current_tier = tier; }
CpuTierScope::~CpuTierScope() { current_tier = previous_; }

void install_cpu_memory_counter() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (installed.load() != nullptr) return;
  auto* c = new CountingCpuAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(c, /*priority=*/1);  // above the default allocator's registration (priority 0)
  installed.store(c);
}

bool cpu_memory_counter_installed() { return installed.load() != nullptr; }

MemoryStats cpu_memory_stats(CpuTier tier) { return counter().stats(tier); }

void reset_cpu_peak() { counter().reset_peak(); }

void set_cpu_memory_limit(int64_t bytes) { counter().set_limit(bytes); }

}  // namespace shardtrain::memory
