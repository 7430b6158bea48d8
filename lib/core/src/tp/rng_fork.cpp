#include "shardtrain/tp/rng_fork.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <mutex>

namespace shardtrain::tp {
namespace {

// splitmix64's finalizer: a 64-bit value from another, well mixed.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a over the bytes of a generator's state (the CPU's mt19937 state, about 5 KB; a GPU's seed and offset).
uint64_t hash_state(const at::Tensor& state) {
  const at::Tensor bytes = state.contiguous();
  const auto* p = static_cast<const uint8_t*>(bytes.data_ptr());
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int64_t i = 0; i < bytes.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace

RngFork::RngFork(c10::Device device, int64_t rank) : generator_(at::globalContext().defaultGenerator(device)) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  origin_ = hash_state(generator_.get_state());
  generator_.set_current_seed(mix(origin_ ^ mix(static_cast<uint64_t>(rank) + 1)));
}

RngFork::~RngFork() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_current_seed(mix(origin_));
}

}  // namespace shardtrain::tp
