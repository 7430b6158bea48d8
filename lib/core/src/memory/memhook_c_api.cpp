// The counting CPU allocator behind a C interface, built as libshardtrain_memhook.so so that a Python process
// running PyTorch from the same wheel (bench/torch_reference.py, through ctypes) is measured by exactly the same
// accounting as our own programs.
#include <cstdint>

#include "shardtrain/memory/memory_stats.h"

extern "C" {
void shardtrain_install_cpu_memory_counter() { shardtrain::memory::install_cpu_memory_counter(); }
int64_t shardtrain_cpu_current_bytes() { return shardtrain::memory::cpu_memory_stats().current_bytes; }
int64_t shardtrain_cpu_peak_bytes() { return shardtrain::memory::cpu_memory_stats().peak_bytes; }
void shardtrain_reset_cpu_peak() { shardtrain::memory::reset_cpu_peak(); }
}
