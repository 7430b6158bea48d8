// The MLP's activation and output projection as one autograd node that keeps only the activation's inputs for
// backward and recomputes the rest there (one elementwise pass per layer): a transformer layer keeps one (rows,
// hidden) tensor less with GELU (the activation's output, fc2's input) and two less with SwiGLU (silu's output and
// its product with up, down's input) between forward and backward.
#pragma once

#include <ATen/core/Tensor.h>

namespace shardtrain::models {

// fc2(gelu(h)): h (..., hidden) = fc1's output, weight (out, hidden), bias (out) or undefined; tanh: GELU's tanh
// approximation. Returns (..., out).
at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias, bool tanh);

// down(silu(gate) * up): gate, up (..., hidden) = the two projections' outputs, weight (out, hidden), bias (out) or
// undefined. Returns (..., out).
at::Tensor swiglu_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                         const at::Tensor& bias);

}  // namespace shardtrain::models
