#include "fused_mlp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "custom_nodes.h"

namespace shardtrain::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GeluLinear : public torch::autograd::Function<GeluLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, bool tanh) {
    ctx->save_for_backward({h, weight});
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["tanh"] = tanh;
    return at::linear(at::gelu(h, tanh ? "tanh" : "none"), weight, bias.value_or(at::Tensor()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], weight = in_dtype_of(saved[1], h);
    const char* approximate = ctx->saved_data["tanh"].toBool() ? "tanh" : "none";
    const at::Tensor grad = in_dtype_of(rows(grads[0]), h);  // (N, out)
    at::Tensor grad_h, grad_weight, grad_bias;
    {  // the recomputed activation lives only for the weight's gradient
      const at::Tensor activated = at::gelu(rows(h), approximate);
      projection_grads(ctx, 1, grad, activated, grad_weight, grad_bias);
    }
    if (ctx->needs_input_grad(0)) {  // GELU's backward in place: one (N, hidden) tensor alive here, not two
      grad_h = grad.mm(weight);
      at::gelu_backward_out(grad_h, grad_h, rows(h), approximate);
      grad_h = grad_h.view(h.sizes());
    }
    return {grad_h, grad_weight, grad_bias, at::Tensor()};
  }
};

struct SwigluLinear : public torch::autograd::Function<SwigluLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({gate, up, weight});
    ctx->saved_data["bias"] = bias.has_value();
    return at::linear(at::silu(gate) * up, weight, bias.value_or(at::Tensor()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor gate = rows(saved[0]), up = rows(saved[1]), weight = in_dtype_of(saved[2], gate);
    const at::Tensor grad = in_dtype_of(rows(grads[0]), gate);  // (N, out)
    at::Tensor grad_gate, grad_up, grad_weight, grad_bias;
    at::Tensor silu = at::silu(gate);
    projection_grads(ctx, 2, grad, silu * up, grad_weight, grad_bias);
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      at::Tensor grad_product = grad.mm(weight);  // (N, hidden)
      if (ctx->needs_input_grad(1)) grad_up = (grad_product * silu).view(saved[1].sizes());
      silu = at::Tensor();
      if (ctx->needs_input_grad(0)) {  // in place: silu's backward of grad_product * up
        grad_product.mul_(up);
        at::silu_backward_out(grad_product, grad_product, gate);
        grad_gate = grad_product.view(saved[0].sizes());
      }
    }
    return {grad_gate, grad_up, grad_weight, grad_bias};
  }
};

}  // namespace

at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias, bool tanh) {
  return GeluLinear::apply(h, weight, optional_input(bias), tanh);
}

at::Tensor swiglu_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                         const at::Tensor& bias) {
  return SwigluLinear::apply(gate, up, weight, optional_input(bias));
}

}  // namespace shardtrain::models
