#include "shardtrain/nn/float8_linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace shardtrain::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kAmaxFloor = 1e-12;  // torchao's EPS: an all-zero tensor's scale stays finite

double float8_max(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat8_e4m3fn: return 448.0;
    case at::kFloat8_e5m2: return 57344.0;
    default: break;
  }
  throw std::invalid_argument(std::string("to_float8: ") + c10::toString(dtype) +
                              " is not a float8 dtype (expected Float8_e4m3fn or Float8_e5m2)");
}

// Each GEMM's operands, cast along the dimension the product contracts: a (M, K)'s rows along K (dim 1), b
// (K, N)'s columns along K (dim 0). Tensorwise: one scale each, whatever the dimension.
struct Casts {
  at::ScalarType forward, grad_output;  // x and W's dtype; grad_y's
  bool rowwise, power_of_2;
};

Casts casts_of(parallel::Float8Recipe recipe) {
  if (recipe == parallel::Float8Recipe::ROWWISE) return {at::kFloat8_e4m3fn, at::kFloat8_e4m3fn, true, true};
  return {at::kFloat8_e4m3fn, at::kFloat8_e5m2, false, false};
}

// `x` cast as the left (contracted along dim 1) or right (along dim 0) operand of a product.
Float8Tensor operand(const at::Tensor& x, at::ScalarType dtype, const Casts& c, bool left) {
  return to_float8(x, dtype, c.rowwise ? (left ? 1 : 0) : -1, c.power_of_2);
}

parallel::Float8Recipe recipe_of(AutogradContext* ctx) {
  return static_cast<parallel::Float8Recipe>(ctx->saved_data["recipe"].toInt());
}

struct Float8Matmul : public torch::autograd::Function<Float8Matmul> {
  // x (M, K), weight (N, K) -> (M, N) in x's dtype.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t recipe) {
    // x only for the weight's gradient (a frozen weight, LoRA's base, keeps nothing of its input).
    ctx->save_for_backward({weight.requires_grad() ? x : at::Tensor(), weight});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["recipe"] = recipe;
    const Casts c = casts_of(static_cast<parallel::Float8Recipe>(recipe));
    return float8_mm(operand(x, c.forward, c, true), operand(weight.t(), c.forward, c, false), x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor grad = grads[0].to(dtype).contiguous();  // (M, N)
    const Casts c = casts_of(recipe_of(ctx));
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) {  // (M, N) @ (N, K)
      grad_x = float8_mm(operand(grad, c.grad_output, c, true), operand(weight, c.forward, c, false), dtype);
    }
    if (ctx->needs_input_grad(1)) {  // (N, M) @ (M, K)
      grad_weight = float8_mm(operand(grad.t(), c.grad_output, c, true), operand(x, c.forward, c, false),
                              grad.scalar_type())
                        .to(weight.scalar_type());
    }
    return {grad_x, grad_weight, at::Tensor()};
  }
};

}  // namespace

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, int64_t dim, bool power_of_2_scale) {
  const double max = float8_max(dtype);
  if (x.dim() != 2) {
    throw std::invalid_argument("to_float8: a 2-D tensor, got " + std::to_string(x.dim()) + " dimensions");
  }
  at::NoGradGuard no_grad;
  at::Tensor amax;
  {  // |x| freed before the float32 copy below: one x-sized temporary at a time
    const at::Tensor magnitude = x.abs();
    amax = dim < 0 ? magnitude.max() : std::get<0>(magnitude.max(dim, /*keepdim=*/true));
  }
  // In float64, as torchao (eager and compiled agree there), then float32.
  at::Tensor scale = (max / amax.to(at::kDouble).clamp_min(kAmaxFloor)).to(at::kFloat);
  if (power_of_2_scale) scale = at::exp2(at::floor(at::log2(scale)));
  // torchao's clamp(float32(x) * scale) in one float32 copy, scaled and clamped in place (4 bytes an element).
  at::Tensor scaled = x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  scaled.mul_(scale).clamp_(-max, max);
  return {scaled.to(dtype), scale};
}

at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype) {
  // _scaled_mm's layouts: a row-major, b column-major (b^T row-major).
  const at::Tensor left = a.data.is_contiguous() ? a.data : a.data.contiguous();
  const at::Tensor right = b.data.t().is_contiguous() ? b.data : b.data.t().contiguous().t();
  const at::Tensor inverse_a = a.scale.reciprocal(), inverse_b = b.scale.reciprocal();
  const bool rowwise = a.scale.dim() > 0 || b.scale.dim() > 0;
  if (!rowwise) return at::_scaled_mm(left, right, inverse_a, inverse_b, {}, {}, out_dtype);
  if (left.is_cuda()) return at::_scaled_mm(left, right, inverse_a, inverse_b, {}, {}, out_dtype);
  const at::Tensor one = at::ones({}, a.scale.options());
  const at::Tensor product = at::_scaled_mm(left, right, one, one, {}, {}, at::kFloat);
  return (product * inverse_a * inverse_b).to(out_dtype);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         parallel::Float8Recipe recipe) {
  const int64_t in = weight.size(1);
  if (x.dim() < 1 || x.size(-1) != in) {
    throw std::invalid_argument("float8_linear: input " + c10::str(x.sizes()) + " against a weight " +
                                c10::str(weight.sizes()) + " (expected the input's last dimension " +
                                std::to_string(in) + ")");
  }
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  at::Tensor y = Float8Matmul::apply(x.reshape({-1, in}), weight, static_cast<int64_t>(recipe)).view(out_sizes);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace shardtrain::nn
