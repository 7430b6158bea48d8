// nn::float8_linear against torchao's Float8Linear on the same inputs (tests/reference/float8_reference.py): the
// output and the input's and weight's gradients of both recipes, each to within one rounding of its dtype, where
// the same layer in high precision is a float8 rounding (percents) away — so a GEMM left in bf16, a scale along the
// wrong dimension or a gradient cast to the wrong float8 fails.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <string>

#include "shardtrain/io/safetensors.h"
#include "shardtrain/nn/float8_linear.h"

namespace shardtrain::nn {
namespace {

std::string reference_file() {
  const char* dir = std::getenv("SHARDTRAIN_FLOAT8_REFERENCE");
  return std::string(dir ? dir : "build/hf_reference/float8") + "/cases.safetensors";
}

// max |got - want| over max |want|.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return (g - w).abs().max().item<double>() / (w.abs().max().item<double>() + 1e-30);
}

TEST(Float8Parity, LinearMatchesTorchaoForEachRecipe) {
  const io::SafetensorsReader file(reference_file());
  int cases = 0;
  for (const std::string recipe : parallel::float8_recipe_names()) {
    for (int k = 0; file.find(recipe + "." + std::to_string(k) + ".x") != nullptr; ++k, ++cases) {
      const std::string prefix = recipe + "." + std::to_string(k) + ".";
      SCOPED_TRACE(prefix);
      const at::Tensor x = file.read(prefix + "x").requires_grad_();
      const at::Tensor weight = file.read(prefix + "weight").requires_grad_();
      const at::Tensor grad_y = file.read(prefix + "grad_y");
      const at::Tensor y = float8_linear(x, weight, {}, parallel::float8_recipe_named(recipe));
      y.backward(grad_y);
      // One rounding of the dtype (bf16: 2^-8 of the largest value; float32: summation order, 1e-5); measured on
      // the CPU: identical bits, torchao running the same casts and _scaled_mm (rowwise: power-of-2 scales divide
      // exactly, so its float32 emulation is our unit-scale product times the scales).
      const double rounding = x.scalar_type() == at::kBFloat16 ? 1.0 / 256 : 1e-5;
      EXPECT_EQ(y.scalar_type(), x.scalar_type());
      EXPECT_LE(relative_error(y, file.read(prefix + "y")), rounding);
      EXPECT_LE(relative_error(x.grad(), file.read(prefix + "grad_x")), rounding);
      EXPECT_LE(relative_error(weight.grad(), file.read(prefix + "grad_weight")), rounding);
      // The same layer in high precision is float8's rounding away: the products above were float8's.
      at::Tensor exact_x = x.detach().to(at::kDouble).requires_grad_();
      at::Tensor exact_weight = weight.detach().to(at::kDouble).requires_grad_();
      at::linear(exact_x, exact_weight).backward(grad_y.to(at::kDouble));
      EXPECT_GT(relative_error(y, at::linear(x.detach().to(at::kDouble), weight.detach().to(at::kDouble))),
                4 * rounding);
      EXPECT_GT(relative_error(weight.grad(), exact_weight.grad()), 4 * rounding);
    }
  }
  EXPECT_EQ(cases, 6) << "the reference's cases";
}

}  // namespace
}  // namespace shardtrain::nn
