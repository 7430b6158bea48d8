// Activation checkpointing in one process: a checkpointed stack of transformer layers with dropout gives the same
// loss, input gradient and parameter gradients as the plain stack, leaves the random stream where the plain run
// leaves it, keeps less memory alive between forward and backward (counted by the project's allocator), and fails
// clearly where it cannot be right.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/blocks.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/intercept.h"
#include "support/expect_error.h"
#include "support/layer_stack.h"

namespace shardtrain::nn {
namespace {

using testing::kDim, testing::kLayers, testing::Stack, testing::Result, testing::make_stack, testing::run,
    testing::expect_same, testing::padding_bias_for;

TEST(ActivationCheckpoint, SameGradientsAndRandomStreamWithDropout) {
  Stack plain = make_stack(0.2);
  Stack checkpointed = make_stack(0.2);
  const auto names = apply_activation_checkpointing(checkpointed.ptr(), [](const std::string& name, torch::nn::Module&) {
    return name.rfind("layers", 0) == 0 && name.find('.') == std::string::npos;
  });
  EXPECT_EQ(names, (std::vector<std::string>{"layers0", "layers1", "layers2", "layers3"}));
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({3, 9, kDim});
  const at::Tensor bias = padding_bias_for(3, 9);
  const Result want = run(plain, x, bias);
  const Result got = run(checkpointed, x, bias);
  expect_same(want, got);
  // The output's backward is the checkpoint's: nothing of the layers' insides was recorded.
  at::Tensor out = checkpointed(x.clone().requires_grad_(true), bias);
  ASSERT_TRUE(out.grad_fn());
  EXPECT_EQ(out.grad_fn()->name(), "CheckpointBackward");
}

TEST(ActivationCheckpoint, NestedRegionsAndWholeModel) {
  Stack plain = make_stack(0.1);
  Stack nested = make_stack(0.1);
  apply_activation_checkpoint(*nested);  // the whole stack, and every layer inside it
  for (auto& layer : nested->layers) apply_activation_checkpoint(*layer);
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({2, 7, kDim});
  const at::Tensor bias = padding_bias_for(2, 7);
  expect_same(run(plain, x, bias), run(nested, x, bias));
}

TEST(ActivationCheckpoint, ParametersOnlyAndFrozenParameters) {
  // The input does not require a gradient (the first layer of a model after an embedding lookup with frozen
  // embeddings); one layer's parameters are frozen.
  Stack plain = make_stack(0.0, 2);
  Stack checkpointed = make_stack(0.0, 2);
  for (auto* s : {&plain, &checkpointed}) {
    for (auto& p : (*s)->layers[0]->parameters()) {
      p.requires_grad_(false);
    }
  }
  for (auto& layer : checkpointed->layers) apply_activation_checkpoint(*layer);
  torch::manual_seed(8);
  const at::Tensor x = torch::randn({2, 5, kDim});
  auto grads = [&](Stack& s) {
    s->zero_grad();
    s->forward(x, {}).sum().backward();
    std::vector<at::Tensor> g;
    for (const auto& p : s->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    return g;
  };
  const auto want = grads(plain), got = grads(checkpointed);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].defined(), got[i].defined()) << "parameter " << i;
    if (want[i].defined()) {
      EXPECT_TRUE(torch::allclose(want[i], got[i], 0, 0)) << "parameter " << i;
    }
  }
}

TEST(ActivationCheckpoint, WithoutGradModeRunsPlainly) {
  Stack stack = make_stack(0.0);
  apply_activation_checkpoint(*stack->layers[0]);
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({2, 4, kDim});
  at::Tensor out = stack->forward(x, {});
  EXPECT_FALSE(out.grad_fn());
  remove_activation_checkpoint(*stack->layers[0]);
  EXPECT_TRUE(torch::equal(out, stack->forward(x, {})));
}

TEST(ActivationCheckpoint, KeepsLessAliveBetweenForwardAndBackward) {
  memory::install_cpu_memory_counter();
  // Long sequences: the layers' insides (attention probabilities (B, H, T, T), MLP activations (B, T, 4C)) dwarf
  // their inputs (B, T, C).
  auto alive_after_forward = [](bool checkpoint) {
    Stack stack = make_stack(0.0);
    if (checkpoint) {
      for (auto& layer : stack->layers) apply_activation_checkpoint(*layer);
    }
    const at::Tensor x = torch::randn({2, 128, kDim}).requires_grad_(true);
    const int64_t before = memory::cpu_memory_stats().current_bytes;
    at::Tensor loss = stack->forward(x, {}).pow(2).mean();
    const int64_t alive = memory::cpu_memory_stats().current_bytes - before;
    loss.backward();
    return alive;
  };
  const int64_t plain = alive_after_forward(false);
  const int64_t checkpointed = alive_after_forward(true);
  std::cout << "alive between forward and backward: plain " << plain << " B, checkpointed " << checkpointed << " B\n";
  // Each checkpointed layer keeps its input, 2*128*32*4 = 32 KiB; plain layers keep their attention maps and MLP
  // activations as well, several hundred KiB each.
  EXPECT_LT(checkpointed * 4, plain) << "plain " << plain << " B, checkpointed " << checkpointed << " B";
  EXPECT_LT(checkpointed, kLayers * 2 * 128 * kDim * 4 * 2);  // about one input per layer (and the output)
}

TEST(ActivationCheckpoint, ReplayRunsOnlyTheBodyWhateverTheOrderOfInterceptors) {
  struct Counter : Interceptor {
    int calls = 0;
    TensorVec around(torch::nn::Module&, TensorVec inputs, const Next& next) override {
      ++calls;
      return next(std::move(inputs));
    }
    std::string name() const override { return "counter"; }
  };
  Stack stack = make_stack(0.0, 1);
  auto& layer = *stack->layers[0];
  apply_activation_checkpoint(layer);
  auto counter = std::make_shared<Counter>();
  layer.interceptors().add(counter);  // added after the checkpoint, still outside it
  ASSERT_EQ(layer.interceptors().list().size(), 2u);
  EXPECT_EQ(layer.interceptors().list().front()->name(), "counter");
  at::Tensor x = torch::randn({1, 3, kDim}).requires_grad_(true);
  stack->forward(x, {}).sum().backward();
  EXPECT_EQ(counter->calls, 1);
  EXPECT_TRUE(x.grad().defined());
}

TEST(ActivationCheckpoint, RetainGraphAllowsASecondBackward) {
  Stack plain = make_stack(0.0, 2);
  Stack checkpointed = make_stack(0.0, 2);
  for (auto& layer : checkpointed->layers) apply_activation_checkpoint(*layer);
  const at::Tensor x = torch::randn({2, 3, kDim});
  for (auto* s : {&plain, &checkpointed}) {
    at::Tensor loss = (*s)->forward(x, {}).sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
  }
  auto a = plain->parameters(), b = checkpointed->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad(), 1e-6, 1e-7));
}

TEST(ActivationCheckpoint, WithoutPreservedRandomStateDropoutDiffers) {
  Stack plain = make_stack(0.5, 1);
  Stack checkpointed = make_stack(0.5, 1);
  apply_activation_checkpoint(*checkpointed->layers[0], ActivationCheckpointOptions{.preserve_rng_state = false});
  const at::Tensor x = torch::randn({2, 16, kDim});
  const Result want = run(plain, x, {});
  const Result got = run(checkpointed, x, {});
  EXPECT_DOUBLE_EQ(want.loss, got.loss);  // the forward itself is the same
  EXPECT_FALSE(torch::allclose(want.x_grad, got.x_grad));  // the replay drew other masks
}

TEST(ActivationCheckpoint, ErrorsNameTheModuleAndTheReason) {
  torch::nn::Linear linear(4, 4);
  testing::expect_error<std::invalid_argument>([&] { apply_activation_checkpoint(*linear); }, {"Linear", "Interceptable"});
  Stack stack = make_stack(0.0, 2);
  apply_activation_checkpoint(*stack->layers[0], {}, "layers0");
  testing::expect_error<std::invalid_argument>([&] { apply_activation_checkpoint(*stack->layers[0], {}, "layers0"); },
                                   {"layers0", "checkpointed already"});
  // A bad selection checkpoints nothing.
  torch::nn::Sequential seq(torch::nn::Linear(2, 2));
  testing::expect_error<std::invalid_argument>(
      [&] { apply_activation_checkpointing(seq.ptr(), [](const std::string&, torch::nn::Module&) { return true; }); },
      {"Sequential"});

  // An input changed in place between forward and backward.
  at::Tensor x = torch::randn({1, 3, kDim}).requires_grad_(true);
  at::Tensor h = x * 1.0;
  at::Tensor loss = stack->layers[0]->forward(h, {}, {}, {}, {}, 0).sum();
  {
    torch::NoGradGuard no_grad;
    h.add_(1.0);
  }
  testing::expect_error<std::runtime_error>([&] { loss.backward(); }, {"layers0", "input 0", "modified in place"});

  // Higher-order gradients.
  at::Tensor y = torch::randn({1, 3, kDim}).requires_grad_(true);
  at::Tensor out = stack->layers[0]->forward(y, {}, {}, {}, {}, 0).pow(2).sum();
  testing::expect_error<std::runtime_error>(
      [&] { torch::autograd::grad({out}, {y}, {}, true, /*create_graph=*/true); }, {"layers0", "create_graph"});
}

}  // namespace
}  // namespace shardtrain::nn
