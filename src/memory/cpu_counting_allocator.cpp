#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <stdexcept>

#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::memory {
namespace {

// Wraps the allocator that was installed before it. Each allocation's DataPtr carries a small record (the
// original DataPtr and its size) so that the free is counted and then handed to the original deleter.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr inner = base_->allocate(nbytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* record = new Record{std::move(inner), static_cast<int64_t>(nbytes), this};
    add(record->nbytes);
    return c10::DataPtr(data, record, &CountingCpuAllocator::free_record, device);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  MemoryStats stats() const {
    return MemoryStats{current_.load(), peak_.load(), allocations_.load()};
  }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  struct Record {
    c10::DataPtr inner;
    int64_t nbytes;
    CountingCpuAllocator* owner;
  };

  static void free_record(void* context) {
    auto* record = static_cast<Record*>(context);
    record->owner->current_.fetch_sub(record->nbytes);
    delete record;  // frees the memory through the original DataPtr's deleter
  }

  void add(int64_t nbytes) {
    allocations_.fetch_add(1);
    const int64_t now = current_.fetch_add(nbytes) + nbytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }

  c10::Allocator* base_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// The one counter of this process (see the header: c10's CPU allocator slot is itself process-wide). Leaked on
// purpose: tensors freed during static destruction still call into it.
std::atomic<CountingCpuAllocator*> installed{nullptr};
std::mutex install_mutex;

CountingCpuAllocator& counter() {
  CountingCpuAllocator* c = installed.load();
  if (c == nullptr) {
    throw std::logic_error("CPU memory counter is not installed: call install_cpu_memory_counter() first");
  }
  return *c;
}

}  // namespace

void install_cpu_memory_counter() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (installed.load() != nullptr) return;
  auto* c = new CountingCpuAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(c, /*priority=*/1);  // above the default allocator's registration (priority 0)
  installed.store(c);
}

bool cpu_memory_counter_installed() { return installed.load() != nullptr; }

MemoryStats cpu_memory_stats() { return counter().stats(); }

void reset_cpu_peak() { counter().reset_peak(); }

}  // namespace shardtrain::memory
