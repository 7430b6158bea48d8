// AfterAccumulate (lib/core/src/nn/after_accumulate.h): the callback runs once per backward with .grad filled, and a callback
// that takes .grad away frees it there and then — the engine's own reference to the incoming gradient is dropped
// first (fully_shard relies on it to hand a unit's gradients to its reduce-scatter without holding them twice).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>

#include "nn/after_accumulate.h"
#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::nn {
namespace {

TEST(AfterAccumulate, ACallbackThatTakesTheGradientFreesIt) {
  memory::install_cpu_memory_counter();
  const at::Tensor w = at::randn({1000, 250}).requires_grad_();  // 1 MB at float32
  int calls = 0;
  double sum = 0;
  int64_t freed = -1;
  auto accumulator = torch::autograd::impl::grad_accumulator(w);  // held: the tensor keeps it weakly
  accumulator->add_post_hook(std::make_unique<AfterAccumulate>([&] {
    ++calls;
    at::Tensor& grad = w.mutable_grad();
    ASSERT_TRUE(grad.defined());
    sum = grad.sum().item<double>();
    const int64_t before = memory::cpu_memory_stats().current_bytes;
    grad = at::Tensor();
    freed = before - memory::cpu_memory_stats().current_bytes;
  }));
  for (int step = 0; step < 2; ++step) {
    (w * 2).sum().backward();  // the incoming gradient is a fresh (1000, 250) tensor of 2s, stolen into .grad
    EXPECT_EQ(calls, step + 1);
    EXPECT_DOUBLE_EQ(sum, 2.0 * 1000 * 250);
    EXPECT_EQ(freed, static_cast<int64_t>(w.nbytes())) << "the engine still held the gradient taken from .grad";
  }
}

}  // namespace
}  // namespace shardtrain::nn
