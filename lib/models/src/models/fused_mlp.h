// The MLP's activation and output projection as one autograd node that keeps only the activation's inputs for
// backward and recomputes the rest there (one elementwise pass per layer): a transformer layer keeps one (rows,
// hidden) tensor less with GELU (the activation's output, fc2's input) and two less with SwiGLU (silu's output and
// its product with up, down's input) between forward and backward.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace shardtrain::models {

// fc2(gelu(h)): h (..., hidden) = fc1's output, weight (out, hidden), bias (out) or undefined; tanh: GELU's tanh
// approximation. Returns (..., out).
at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias, bool tanh);

// down(silu(gate) * up): gate, up (..., hidden) = the two projections' outputs, weight (out, hidden), bias (out) or
// undefined. Returns (..., out).
at::Tensor swiglu_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                         const at::Tensor& bias);

// The same with a LoRA adapter on the output projection (models/lora.h): also A's product of the activation, h A^T
// (..., r), which the caller scales through B; the node keeps what the one without keeps, and A. lora_a (r, hidden).
// Returns ((..., out), (..., r)). (Dropout on the adapter's input needs the activation itself: not this node.)
std::pair<at::Tensor, at::Tensor> gelu_lora_linear(const at::Tensor& h, const at::Tensor& weight,
                                                   const at::Tensor& bias, const at::Tensor& lora_a, bool tanh);
std::pair<at::Tensor, at::Tensor> swiglu_lora_linear(const at::Tensor& gate, const at::Tensor& up,
                                                     const at::Tensor& weight, const at::Tensor& bias,
                                                     const at::Tensor& lora_a);

}  // namespace shardtrain::models
