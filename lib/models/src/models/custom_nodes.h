// What the hand-written autograd nodes of the models (fused_mlp.cpp, tied_table.cpp, linear_cross_entropy.cpp) share.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

namespace shardtrain::models {

// (..., n) as (rows, n).
inline at::Tensor rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// Backward computes in the dtype forward's product ran in, that of the input `like` the weight multiplied: under
// autocast the weight was cast for it (and the engine casts the weight's gradient back to the weight's dtype).
inline at::Tensor in_dtype_of(const at::Tensor& t, const at::Tensor& like) { return t.to(like.scalar_type()); }

// An optional input of a node (a bias) as apply() takes it: an empty optional when undefined, since apply() reads
// the device of every at::Tensor argument, undefined or not. The node records whether it had one
// (saved_data["bias"]): an absent optional is no input of the node.
inline std::optional<at::Tensor> optional_input(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// A linear layer's weight (out, in) and bias (out) gradients, as wanted, from its input x (N, in) and the incoming
// gradient (N, out); input `first` of the node is the weight, `first + 1` the bias. The weight's is one mm into a
// tensor of its own (not at::linear's transposed view of one: autograd adds into a gradient in place only when it
// holds the gradient's storage alone).
inline void projection_grads(torch::autograd::AutogradContext* ctx, size_t first, const at::Tensor& grad,
                             const at::Tensor& x, at::Tensor& grad_weight, at::Tensor& grad_bias) {
  if (ctx->needs_input_grad(first)) grad_weight = grad.t().mm(x);
  if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(first + 1)) grad_bias = grad.sum(0);
}

}  // namespace shardtrain::models
