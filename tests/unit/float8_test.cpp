// nn::to_float8 and float8_linear without a reference: the cast's scale and saturation as torchao defines them, and
// the layer's gradients as the products of the operands it casts (torchao's own comparison is the slow tier's
// models.float8_parity).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "shardtrain/nn/float8_linear.h"
#include "support/expect_error.h"

namespace shardtrain::nn {
namespace {

// scale = 448 / amax (e4m3's largest finite value), per tensor or per row, the largest value landing on +-448; a row
// of zeros takes 448 / 1e-12 and stays zero; power-of-2 scales round down.
TEST(Float8, CastScalesByTheAbsoluteMaximumAndSaturates) {
  const at::Tensor x = at::tensor({1.0f, -2.0f, 0.5f, 0.0f, 0.0f, 0.0f}).view({2, 3});
  const Float8Tensor whole = to_float8(x, at::kFloat8_e4m3fn, -1, false);
  EXPECT_EQ(whole.data.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(whole.scale.dim(), 0);
  EXPECT_FLOAT_EQ(whole.scale.item<float>(), 224.0f);
  EXPECT_FLOAT_EQ(whole.data[0][1].to(at::kFloat).item<float>(), -448.0f);
  const Float8Tensor rows = to_float8(x, at::kFloat8_e4m3fn, 1, false);
  ASSERT_EQ(rows.scale.sizes(), (at::IntArrayRef{2, 1}));
  EXPECT_FLOAT_EQ(rows.scale[0][0].item<float>(), 224.0f);
  EXPECT_FLOAT_EQ(rows.scale[1][0].item<float>(), static_cast<float>(448.0 / 1e-12));
  EXPECT_EQ(rows.data[1].to(at::kFloat).abs().sum().item<float>(), 0.0f);
  const Float8Tensor columns = to_float8(x, at::kFloat8_e5m2, 0, true);  // e5m2's 57344 / (1, 2, 0.5) -> 2^k
  ASSERT_EQ(columns.scale.sizes(), (at::IntArrayRef{1, 3}));
  EXPECT_FLOAT_EQ(columns.scale[0][0].item<float>(), 32768.0f);
  EXPECT_FLOAT_EQ(columns.scale[0][1].item<float>(), 16384.0f);
  EXPECT_FLOAT_EQ(columns.scale[0][2].item<float>(), 65536.0f);
  testing::expect_error<std::invalid_argument>([&] { to_float8(x, at::kBFloat16, -1, false); },
                                               {"BFloat16 is not a float8 dtype"});
  testing::expect_error<std::invalid_argument>([&] { to_float8(x.view({6}), at::kFloat8_e4m3fn, -1, false); },
                                               {"a 2-D tensor, got 1 dimensions"});
}

// The layer's output and gradients are the float32 products of its dequantized casts (e4m3 x and W; grad_y in
// e5m2 under tensorwise), in the input's dtype; a bias adds and gets the summed gradient; sizes that disagree are
// named.
TEST(Float8, LinearIsTheProductOfItsCasts) {
  at::manual_seed(7);
  for (const parallel::Float8Recipe recipe : {parallel::Float8Recipe::TENSORWISE, parallel::Float8Recipe::ROWWISE}) {
    SCOPED_TRACE(parallel::to_string(recipe));
    const bool rowwise = recipe == parallel::Float8Recipe::ROWWISE;
    const at::Tensor x = at::randn({2, 8, 32}).to(at::kBFloat16).requires_grad_();
    const at::Tensor weight = (at::randn({48, 32}) / 6).to(at::kBFloat16).requires_grad_();
    const at::Tensor bias = at::randn({48}).to(at::kBFloat16).requires_grad_();
    const at::Tensor grad_y = at::randn({2, 8, 48}).to(at::kBFloat16) * 1e-2;
    const at::Tensor y = float8_linear(x, weight, bias, recipe);
    y.backward(grad_y);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    auto dequantized = [&](const at::Tensor& t, at::ScalarType dtype, int64_t dim) {
      const Float8Tensor f = to_float8(t, dtype, rowwise ? dim : -1, rowwise);
      return f.data.to(at::kFloat) / f.scale;
    };
    const at::ScalarType grad_dtype = rowwise ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
    const at::Tensor x2 = x.detach().view({16, 32}), g2 = grad_y.view({16, 48});
    const at::Tensor w = weight.detach();
    const at::Tensor want_y = dequantized(x2, at::kFloat8_e4m3fn, 1).mm(dequantized(w.t(), at::kFloat8_e4m3fn, 0));
    const at::Tensor want_grad_x = dequantized(g2, grad_dtype, 1).mm(dequantized(w, at::kFloat8_e4m3fn, 0));
    const at::Tensor want_grad_w = dequantized(g2.t(), grad_dtype, 1).mm(dequantized(x2, at::kFloat8_e4m3fn, 0));
    auto close = [](const at::Tensor& got, const at::Tensor& want) {  // one bf16 rounding of the largest value
      return (got.to(at::kFloat) - want).abs().max().item<float>() <= want.abs().max().item<float>() / 256;
    };
    EXPECT_TRUE(close(y.detach().view({16, 48}), want_y + bias.detach().to(at::kFloat)));
    EXPECT_TRUE(close(x.grad().view({16, 32}), want_grad_x));
    EXPECT_TRUE(close(weight.grad(), want_grad_w));
    EXPECT_TRUE(close(bias.grad(), g2.to(at::kFloat).sum(0)));
  }
  testing::expect_error<std::invalid_argument>(
      [] { float8_linear(at::zeros({4, 16}), at::zeros({8, 32}), {}, parallel::Float8Recipe::TENSORWISE); },
      {"input [4, 16] against a weight [8, 32]", "last dimension 32"});
  testing::expect_error<std::invalid_argument>([] { parallel::float8_recipe_named("delayed"); },
                                               {"float8 recipe 'delayed' is not one of tensorwise, rowwise"});
}

}  // namespace
}  // namespace shardtrain::nn
