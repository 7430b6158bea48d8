#include "shardtrain/tp/rng_fork.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <mutex>

#include "shardtrain/util/mix64.h"

namespace shardtrain::tp {

RngFork::RngFork(c10::Device device, int64_t rank) : generator_(at::globalContext().defaultGenerator(device)) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  // The state's bytes: the CPU's mt19937 state (about 5 KB), a GPU's seed and offset.
  const at::Tensor state = generator_.get_state().contiguous();
  origin_ = util::fnv1a(state.data_ptr(), state.nbytes());
  generator_.set_current_seed(util::mix64(origin_ ^ util::mix64(static_cast<uint64_t>(rank) + 1)));
}

RngFork::~RngFork() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_current_seed(util::mix64(origin_));
}

}  // namespace shardtrain::tp
