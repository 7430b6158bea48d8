// Activation offloading in one process: a stack of transformer layers whose calls offload what they save gives the
// loss, input gradient, parameter gradients and random stream of the plain stack exactly, with and without
// checkpointing; what the layers keep between forward and backward leaves the compute tier for the host tier (the
// project's allocator counts both), the parameters stay, backward brings back two layers at most at once, nothing
// stays behind after it; errors are clear.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/activation_offload.h"
#include "support/expect_error.h"
#include "support/layer_stack.h"

namespace shardtrain::nn {
namespace {

using testing::kDim, testing::kLayers, testing::Stack, testing::Result, testing::make_stack, testing::run,
    testing::expect_same, testing::padding_bias_for;

bool is_layer(const std::string& name, torch::nn::Module&) {
  return name.rfind("layers", 0) == 0 && name.find('.') == std::string::npos;
}

TEST(ActivationOffload, SameGradientsAndRandomStreamWithDropout) {
  memory::install_cpu_memory_counter();
  Stack plain = make_stack(0.2);
  Stack offloaded = make_stack(0.2);
  EXPECT_EQ(apply_activation_offloading(offloaded.ptr(), is_layer),
            (std::vector<std::string>{"layers0", "layers1", "layers2", "layers3"}));
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({3, 9, kDim});
  const at::Tensor bias = padding_bias_for(3, 9);
  const int64_t host_before = memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes;
  const Result want = run(plain, x, bias);
  const Result got = run(offloaded, x, bias);
  expect_same(want, got);
  // Offloaded and checkpointed: the checkpoints' inputs are what moves.
  Stack both = make_stack(0.2);
  apply_activation_checkpointing(both.ptr(), is_layer);
  apply_activation_offloading(both.ptr(), is_layer);
  expect_same(want, run(both, x, bias));
  EXPECT_EQ(memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes, host_before);  // nothing left behind
}

struct Measured {
  int64_t compute_alive = 0;  // compute tier between forward and backward, above the start
  int64_t host_alive = 0;     // host tier then
  int64_t compute_peak = 0;   // compute tier's peak over forward and backward, above the start
  int64_t host_after = 0;     // host tier after backward, above the start
};

enum class Mode { PLAIN, OFFLOAD, CHECKPOINT, CHECKPOINT_AND_OFFLOAD };

// Long sequences: the layers' insides (attention probabilities (B, H, T, T), MLP activations (B, T, 4C)) dwarf their
// inputs (B, T, C) and the parameters.
Measured measure(Mode mode) {
  Stack stack = make_stack(0.0);
  if (mode == Mode::CHECKPOINT || mode == Mode::CHECKPOINT_AND_OFFLOAD) {
    apply_activation_checkpointing(stack.ptr(), is_layer);
  }
  if (mode == Mode::OFFLOAD || mode == Mode::CHECKPOINT_AND_OFFLOAD) apply_activation_offloading(stack.ptr(), is_layer);
  const at::Tensor x = torch::randn({2, 128, kDim}).requires_grad_(true);
  memory::reset_cpu_peak();
  const int64_t compute0 = memory::cpu_memory_stats().current_bytes;
  const int64_t host0 = memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes;
  Measured m;
  {
    at::Tensor loss = stack->forward(x, {}).pow(2).mean();
    m.compute_alive = memory::cpu_memory_stats().current_bytes - compute0;
    m.host_alive = memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes - host0;
    loss.backward();
  }
  m.compute_peak = memory::cpu_memory_stats().peak_bytes - compute0;
  m.host_after = memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes - host0;
  return m;
}

TEST(ActivationOffload, WhatLayersKeepMovesToTheHostTier) {
  memory::install_cpu_memory_counter();
  const Measured plain = measure(Mode::PLAIN), offloaded = measure(Mode::OFFLOAD);
  const Measured checkpointed = measure(Mode::CHECKPOINT), both = measure(Mode::CHECKPOINT_AND_OFFLOAD);
  for (const auto& [name, m] : {std::pair{"plain", plain}, {"offloaded", offloaded}, {"checkpointed", checkpointed},
                                {"checkpointed and offloaded", both}}) {
    std::cout << name << ": compute alive " << m.compute_alive << " B, host " << m.host_alive << " B, compute peak "
              << m.compute_peak << " B\n";
  }
  // Between forward and backward the compute tier keeps the stack's output and the loss (2*128*32*4 = 32 KiB and 4
  // bytes); everything else the plain stack kept is in the host tier, and nothing is in both: parameters (49 KiB a
  // layer), the input (the caller's) and tensors saved twice are not copied.
  const int64_t output = 2 * 128 * kDim * 4;
  EXPECT_LE(offloaded.compute_alive, output + 1024);
  EXPECT_EQ(offloaded.compute_alive + offloaded.host_alive, plain.compute_alive);
  // Checkpointed, each layer's input moves but the first's (the caller's), 32 KiB each.
  EXPECT_EQ(both.host_alive, (kLayers - 1) * output);
  EXPECT_EQ(both.compute_alive, checkpointed.compute_alive - (kLayers - 1) * output);
  // Backward brings back a layer and the one before it: the peak is far below the plain stack's, and no higher than
  // checkpointing's alone.
  const int64_t per_layer = (plain.compute_alive - output) / kLayers;
  EXPECT_LT(offloaded.compute_peak, plain.compute_peak - (kLayers - 3) * per_layer);
  EXPECT_LE(both.compute_peak, checkpointed.compute_peak);
  for (const Measured& m : {offloaded, both}) EXPECT_EQ(m.host_after, 0);
}

TEST(ActivationOffload, WithoutGradModeAndAfterRemovalRunsPlainly) {
  memory::install_cpu_memory_counter();
  Stack stack = make_stack(0.0);
  apply_activation_offloading(stack.ptr(), is_layer);
  const at::Tensor x = torch::randn({2, 4, kDim});
  const int64_t host0 = memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes;
  at::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = stack->forward(x, {});
  }
  EXPECT_EQ(memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes, host0);
  for (auto& layer : stack->layers) {
    EXPECT_TRUE(is_activation_offloaded(*layer));
    EXPECT_TRUE(remove_activation_offload(*layer));
    EXPECT_FALSE(remove_activation_offload(*layer));
  }
  at::Tensor loss = stack->forward(x.clone().requires_grad_(true), {}).sum();
  EXPECT_EQ(memory::cpu_memory_stats(memory::CpuTier::HOST).current_bytes, host0);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(out, stack->forward(x, {})));
}

TEST(ActivationOffload, ErrorsNameTheModuleAndTheReason) {
  torch::nn::Sequential seq(torch::nn::Linear(2, 2));
  testing::expect_error<std::invalid_argument>(
      [&] { apply_activation_offloading(seq.ptr(), [](const std::string&, torch::nn::Module&) { return true; }); },
      {"Sequential", "Interceptable"});
  EXPECT_FALSE(is_activation_offloaded(*seq));
  Stack stack = make_stack(0.0, 2);
  apply_activation_offloading(stack.ptr(), is_layer);
  testing::expect_error<std::invalid_argument>([&] { apply_activation_offloading(stack.ptr(), is_layer); },
                                               {"layers0", "offloads already"});

  // A saved tensor changed in place between forward and backward: autograd's own check, made on the copy's way back.
  at::Tensor x = torch::randn({1, 3, kDim}).requires_grad_(true);
  at::Tensor h = x * 1.0;
  at::Tensor loss = stack->layers[0]->forward(h, {}, {}, {}, {}, 0).sum();
  {
    torch::NoGradGuard no_grad;
    h.add_(1.0);
  }
  testing::expect_error<std::runtime_error>([&] { loss.backward(); }, {"modified by an inplace operation"});
}

}  // namespace
}  // namespace shardtrain::nn
