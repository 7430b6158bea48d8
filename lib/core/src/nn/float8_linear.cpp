#include "shardtrain/nn/float8_linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <optional>
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
  // x (M, K), weight (N, K) -> (M, N) in x's dtype. weight_data (N, K) and weight_scale: the weight cast ahead
  // (tensorwise), or undefined.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t recipe,
                            const std::optional<at::Tensor>& weight_data,
                            const std::optional<at::Tensor>& weight_scale) {
    const bool cast_ahead = weight_data.has_value();
    // x only for the weight's gradient (a frozen weight, LoRA's base, keeps nothing of its input).
    ctx->save_for_backward({weight.requires_grad() ? x : at::Tensor(), cast_ahead ? at::Tensor() : weight});
    // A weight cast ahead is a view of FSDP's gathered buffer, refilled in place when backward gathers again: kept
    // beside save_for_backward, whose version check would take the refill for a modification.
    if (cast_ahead) {
      ctx->saved_data["weight_data"] = *weight_data;
      ctx->saved_data["weight_scale"] = *weight_scale;
    }
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["recipe"] = recipe;
    const Casts c = casts_of(static_cast<parallel::Float8Recipe>(recipe));
    const Float8Tensor w = cast_ahead ? Float8Tensor{weight_data->t(), *weight_scale}
                                      : operand(weight.t(), c.forward, c, false);
    return float8_mm(operand(x, c.forward, c, true), w, x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const at::Tensor grad = grads[0].to(dtype).contiguous();  // (M, N)
    const Casts c = casts_of(recipe_of(ctx));
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) {  // (M, N) @ (N, K)
      const Float8Tensor w = weight.defined() ? operand(weight, c.forward, c, false)
                                              : Float8Tensor{ctx->saved_data["weight_data"].toTensor(),
                                                             ctx->saved_data["weight_scale"].toTensor()};
      grad_x = float8_mm(operand(grad, c.grad_output, c, true), w, dtype);
    }
    if (ctx->needs_input_grad(1)) {  // (N, M) @ (M, K)
      grad_weight = float8_mm(operand(grad.t(), c.grad_output, c, true), operand(x, c.forward, c, false),
                              grad.scalar_type())
                        .to(weight_dtype);
    }
    return {grad_x, grad_weight, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, int64_t dim, bool power_of_2_scale) {
  float8_max(dtype);  // throws for a dtype that is not float8's
  if (x.dim() != 2) {
    throw std::invalid_argument("to_float8: a 2-D tensor, got " + std::to_string(x.dim()) + " dimensions");
  }
  at::NoGradGuard no_grad;
  // max |x| in one pass, without an |x| temporary: the infinity norm.
  const at::Tensor amax = dim < 0 ? at::linalg_vector_norm(x, INFINITY)
                                  : at::linalg_vector_norm(x, INFINITY, at::IntArrayRef{dim}, /*keepdim=*/true);
  const at::Tensor scale = float8_scale(amax, dtype, power_of_2_scale);
  return {cast_to_float8(x, scale, dtype), scale};
}

at::Tensor float8_scale(const at::Tensor& amax, at::ScalarType dtype, bool power_of_2_scale) {
  // In float64, as torchao (eager and compiled agree there), then float32.
  at::Tensor scale = (float8_max(dtype) / amax.to(at::kDouble).clamp_min(kAmaxFloor)).to(at::kFloat);
  return power_of_2_scale ? at::exp2(at::floor(at::log2(scale))) : scale;
}

at::Tensor cast_to_float8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype) {
  const double max = float8_max(dtype);
  at::NoGradGuard no_grad;
  // torchao's clamp(float32(x) * scale): the product written in float32 (a scale with a dimension promotes it: a
  // 0-dim one would leave it in x's dtype), clamped in place, cast — 4 bytes an element at a time.
  const bool narrow = x.scalar_type() == at::kFloat || at::isReducedFloatingType(x.scalar_type());
  at::Tensor scaled = at::mul(narrow ? x : x.to(at::kFloat), scale.dim() == 0 ? scale.reshape({1}) : scale);
  scaled.clamp_(-max, max);
  return scaled.to(dtype);
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
                         parallel::Float8Recipe recipe, const Float8Tensor* weight_cast) {
  const int64_t in = weight.size(1);
  if (x.dim() < 1 || x.size(-1) != in) {
    throw std::invalid_argument("float8_linear: input " + c10::str(x.sizes()) + " against a weight " +
                                c10::str(weight.sizes()) + " (expected the input's last dimension " +
                                std::to_string(in) + ")");
  }
  if (weight_cast != nullptr && recipe != parallel::Float8Recipe::TENSORWISE) {
    throw std::invalid_argument("float8_linear: a weight cast ahead with one scale under the " +
                                parallel::to_string(recipe) + " recipe, which casts the weight per row (expected "
                                "tensorwise)");
  }
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  // Optional, not undefined: autograd's custom functions take no undefined tensor among their inputs.
  const std::optional<at::Tensor> cast_data = weight_cast ? std::optional(weight_cast->data) : std::nullopt;
  const std::optional<at::Tensor> cast_scale = weight_cast ? std::optional(weight_cast->scale) : std::nullopt;
  at::Tensor y = Float8Matmul::apply(x.reshape({-1, in}), weight, static_cast<int64_t>(recipe), cast_data, cast_scale)
                     .view(out_sizes);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace shardtrain::nn
