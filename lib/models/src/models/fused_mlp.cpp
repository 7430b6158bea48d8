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

// The activation, the output projection and a LoRA adapter's A on the activation, as one node: outputs the
// projection (N, out) and A's product (N, r); keeps the activation's inputs and A. Inputs: the activation's (one
// for GELU, two for SwiGLU), weight, bias (when present), lora_a.
struct ActivationLoraLinear : public torch::autograd::Function<ActivationLoraLinear> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& first,
                               const std::optional<at::Tensor>& maybe_second, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, const at::Tensor& lora_a, int64_t activation) {
    const at::Tensor second = maybe_second.value_or(at::Tensor());
    ctx->save_for_backward({first, second, weight, lora_a});
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["activation"] = activation;
    const at::Tensor h = activated(first, second, activation);
    return {at::linear(h, weight, bias.value_or(at::Tensor())), at::linear(h, lora_a)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto activation = static_cast<int>(ctx->saved_data["activation"].toInt());
    const bool swiglu = activation == kSwiGluCode, with_bias = ctx->saved_data["bias"].toBool();
    const at::Tensor first = rows(saved[0]), second = swiglu ? rows(saved[1]) : at::Tensor();
    const at::Tensor weight = in_dtype_of(saved[2], first), lora_a = in_dtype_of(saved[3], first);
    // Indices of the node's tensor inputs: GELU's second input is undefined, so no input; an absent bias neither.
    const size_t w = swiglu ? 2 : 1, a = w + (with_bias ? 2 : 1);
    const at::Tensor grad = grads[0].defined() ? in_dtype_of(rows(grads[0]), first)
                                               : at::zeros({first.size(0), weight.size(0)}, first.options());
    const at::Tensor grad_z = grads[1].defined() ? in_dtype_of(rows(grads[1]), first)
                                                 : at::zeros({first.size(0), lora_a.size(0)}, first.options());
    at::Tensor grad_first, grad_second, grad_weight, grad_bias, grad_a;
    {  // the recomputed activation lives only for the weights' gradients
      const at::Tensor h = activated(first, second, activation);
      projection_grads(ctx, w, grad, h, grad_weight, grad_bias);
      if (ctx->needs_input_grad(a)) grad_a = grad_z.t().mm(h);
    }
    const bool inputs = ctx->needs_input_grad(0) || (swiglu && ctx->needs_input_grad(1));
    if (inputs) {
      at::Tensor grad_h = grad.mm(weight).add_(grad_z.mm(lora_a));  // (N, hidden)
      if (swiglu) {
        const at::Tensor silu = at::silu(first);
        if (ctx->needs_input_grad(1)) grad_second = (grad_h * silu).view(saved[1].sizes());
        grad_h.mul_(second);
        at::silu_backward_out(grad_h, grad_h, first);
      } else {
        at::gelu_backward_out(grad_h, grad_h, first, activation == kGeluTanhCode ? "tanh" : "none");
      }
      if (ctx->needs_input_grad(0)) grad_first = grad_h.view(saved[0].sizes());
    }
    return {grad_first, grad_second, grad_weight, grad_bias, grad_a, at::Tensor()};
  }

  static constexpr int kGeluCode = 0, kGeluTanhCode = 1, kSwiGluCode = 2;
  static at::Tensor activated(const at::Tensor& first, const at::Tensor& second, int64_t activation) {
    if (activation == kSwiGluCode) return at::silu(first) * second;
    return at::gelu(first, activation == kGeluTanhCode ? "tanh" : "none");
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> gelu_lora_linear(const at::Tensor& h, const at::Tensor& weight,
                                                   const at::Tensor& bias, const at::Tensor& lora_a, bool tanh) {
  const variable_list out = ActivationLoraLinear::apply(
      h, std::nullopt, weight, optional_input(bias), lora_a,
      tanh ? ActivationLoraLinear::kGeluTanhCode : ActivationLoraLinear::kGeluCode);
  return {out[0], out[1]};
}

std::pair<at::Tensor, at::Tensor> swiglu_lora_linear(const at::Tensor& gate, const at::Tensor& up,
                                                     const at::Tensor& weight, const at::Tensor& bias,
                                                     const at::Tensor& lora_a) {
  const variable_list out =
      ActivationLoraLinear::apply(gate, std::optional<at::Tensor>(up), weight, optional_input(bias), lora_a,
                                  ActivationLoraLinear::kSwiGluCode);
  return {out[0], out[1]};
}

at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias, bool tanh) {
  return GeluLinear::apply(h, weight, optional_input(bias), tanh);
}

at::Tensor swiglu_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                         const at::Tensor& bias) {
  return SwigluLinear::apply(gate, up, weight, optional_input(bias));
}

}  // namespace shardtrain::models
