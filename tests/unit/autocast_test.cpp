// autocast_module: the module's matrix products run in the autocast dtype while its parameters and their
// gradients stay float32 and its outputs leave in float32; a checkpointed module replays under the same autocast.
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/autocast.h"
#include "shardtrain/nn/intercept.h"
#include "support/expect_error.h"

namespace shardtrain::nn {
namespace {

struct TwoLayerImpl : Interceptable<TwoLayerImpl, at::Tensor(at::Tensor)> {
  TwoLayerImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 8));
  }
  at::Tensor forward_impl(at::Tensor x) { return fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TwoLayer);

TwoLayer make() {
  torch::manual_seed(2);
  return TwoLayer();
}

TEST(Autocast, LowPrecisionProductsFloat32ParametersAndOutputs) {
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    TwoLayer model = make();
    autocast_module(*model, c10::DeviceType::CPU, dtype);
    const at::Tensor x = torch::randn({4, 16});
    at::Tensor out = model(x);
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    // What autocast computes: each linear in dtype, gelu on its dtype input.
    auto linear = [&](const torch::nn::Linear& l, const at::Tensor& in) {
      return torch::nn::functional::linear(in.to(dtype), l->weight.to(dtype), l->bias.to(dtype));
    };
    const at::Tensor expected = linear(model->fc2, torch::gelu(linear(model->fc1, x))).to(at::kFloat);
    EXPECT_TRUE(torch::equal(out.detach(), expected));
    out.sum().backward();
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat);
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
    }
    EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::DeviceType::CPU)) << "autocast left on after the call";
  }
}

TEST(Autocast, CheckpointReplaysUnderTheForwardsAutocast) {
  TwoLayer plain = make(), checkpointed = make();
  autocast_module(*plain, c10::DeviceType::CPU, at::kBFloat16);
  autocast_module(*checkpointed, c10::DeviceType::CPU, at::kBFloat16);
  apply_activation_checkpoint(*checkpointed);  // inside the autocast interceptor: its replay in backward is outside it
  const at::Tensor x = torch::randn({4, 16});
  plain(x).pow(2).sum().backward();
  checkpointed(x).pow(2).sum().backward();
  auto a = plain->parameters(), b = checkpointed->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].grad(), b[i].grad())) << "parameter " << i;
}

TEST(Autocast, BadArgumentsAreErrors) {
  TwoLayer model = make();
  testing::expect_error<std::invalid_argument>(
      [&] { autocast_module(*model, c10::DeviceType::CPU, at::kFloat); }, {"Float", "BFloat16 or Half"});
  torch::nn::Linear linear(2, 2);
  testing::expect_error<std::invalid_argument>(
      [&] { autocast_module(*linear, c10::DeviceType::CPU, at::kHalf); }, {"Linear", "Interceptable"});
}

}  // namespace
}  // namespace shardtrain::nn
