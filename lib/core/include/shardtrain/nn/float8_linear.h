// Float8 training's linear layer with dynamic scaling (torchao's Float8Linear, its `tensorwise` and `rowwise`
// recipes): y = x W^T + b where each of the three GEMMs — forward x W^T, backward grad_y W and grad_y^T x — takes
// float8 operands, each cast from its high-precision tensor with a scale computed from that tensor's absolute
// maximum at every call (nothing carried between steps), and accumulates and writes in the activations' dtype.
//
//   recipe      operands (forward; grad_y in backward)   scale                        as torchao
//   tensorwise  e4m3; e5m2                               one per tensor                Float8LinearConfig()
//   rowwise     e4m3; e4m3                               one per row of the product    from_recipe_name("rowwise")
//                                                        (the contracted dimension's
//                                                        amax), rounded down to 2^k
//
// The products go through at::_scaled_mm (float8 operands, inverse scales): on the CPU as on a GPU with float8
// tensor cores, so a CPU run trains the arithmetic a GPU run does. The CPU's _scaled_mm takes one scale per tensor
// only: a rowwise product there is its float32 product at unit scales, times the rows' and columns' inverse scales,
// rounded once to the output dtype (what the GPU's rowwise kernel computes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::nn {

// A tensor in float8 with the scale it was multiplied by: data = saturate(x * scale) in float8, x ~ data / scale.
struct Float8Tensor {
  at::Tensor data;   // float8_e4m3fn or float8_e5m2, x's shape (2-D)
  at::Tensor scale;  // float32: a scalar, or x's shape with `dim` of size 1 (one scale per row along dim)
};

// torchao's dynamic cast of a 2-D x: amax = max |x| over the whole tensor (dim < 0) or along `dim`; scale =
// finfo(dtype).max / max(amax, 1e-12), in float64 then float32, rounded down to a power of 2 when asked; data =
// clamp(float32(x) * scale, -max, max) in `dtype`. Throws std::invalid_argument for a dtype that is not float8 or
// x not 2-D.
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType dtype, int64_t dim, bool power_of_2_scale);
// Its two halves, for a tensor whose amax is put together elsewhere (FSDP's float8 all-gather: the MAX over the
// ranks' shards): the scale of an amax (float32, any shape), and x of any shape cast with a scale that broadcasts
// against it. to_float8(x) is cast_to_float8(x, float8_scale(amax of x)).
at::Tensor float8_scale(const at::Tensor& amax, at::ScalarType dtype, bool power_of_2_scale);
at::Tensor cast_to_float8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype);

// a (M, K) @ b (K, N) from float8 operands, each divided by its scale (a scalar, or a's (M, 1) and b's (1, N)), in
// `out_dtype`. Layouts are made what _scaled_mm takes (a row-major, b column-major).
at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype);

// x (..., in) W^T (out, in) + bias (out, or undefined) with the GEMMs in float8 as `recipe` says (above); the
// gradients of x, W and the bias as autograd's, the weight's in its own dtype. x's dtype is the GEMMs' output's.
// `weight_cast` (tensorwise only): W already cast, (out, in) e4m3 with one scale — what FSDP's float8 all-gather
// gathered —, used for both products that read W, whose value is then not read (W stays the product's input, for
// its gradient). Throws std::invalid_argument naming the sizes when x's last dimension is not W's, and for a
// weight_cast under the rowwise recipe (which casts W per row forward and per column backward).
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         parallel::Float8Recipe recipe, const Float8Tensor* weight_cast = nullptr);

// A module whose float8 product reads a weight that can be cast before its call (models::LinearImpl under the
// tensorwise recipe). FSDP's float8 all-gather (fsdp::FsdpOptions::float8_all_gather) finds these in a unit and
// gathers their weights in float8: half the bytes of bf16, and no high-precision copy of the full weight.
class Float8CastAhead {
 public:
  virtual ~Float8CastAhead() = default;
  // The parameter the float8 product reads, as registered; undefined when there is none (another precision, or
  // the rowwise recipe).
  virtual at::Tensor float8_weight() const = 0;
  // Set by FSDP while the unit is unsharded: float8_weight()'s full value in e4m3 as the parameter stores it, with
  // its one scale; undefined otherwise. While it is set the parameter's own data is not the weight
  // (lib/core/src/fsdp/fsdp_param.h): the module computes from this.
  Float8Tensor cast;
};

}  // namespace shardtrain::nn
