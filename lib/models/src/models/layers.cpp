#include "shardtrain/models/layers.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace shardtrain::models {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias, const torch::TensorOptions& options,
                       bool transposed_)
    : transposed(transposed_) {
  weight = register_parameter("weight", transposed ? at::empty({in_features, out_features}, options)
                                                   : at::empty({out_features, in_features}, options));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, options));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  // Transposed, linear's own transpose of matrix() is the stored (in, out) weight: the product reads it as it is.
  // Row-wise split, the adapter's term is a partial sum too (its A holds this rank's input features): it joins the
  // base product before the one reduction.
  // A weight gathered in float8 (cast): its parameter holds no value meanwhile, the product reads the cast.
  const nn::Float8Tensor cast_matrix{transposed && cast.data.defined() ? cast.data.t() : cast.data, cast.scale};
  at::Tensor y = float8 ? nn::float8_linear(x, matrix(), bias_in_product(), *float8,
                                            cast.data.defined() ? &cast_matrix : nullptr)
                       : at::linear(x, matrix(), bias_in_product());
  if (lora_A) {
    const at::Tensor dropped = lora_dropout > 0 && is_training() ? at::dropout(x, lora_dropout, true) : x;
    y = y + at::linear(at::linear(dropped, lora_A->weight), lora_B->weight) * lora_scale;
  }
  return finish_product(y);
}

at::Tensor LinearImpl::finish_product(const at::Tensor& y) const {
  if (!reduce_partial) return y;
  const at::Tensor reduced = reduce_partial(y);
  return bias.defined() ? reduced + bias : reduced;
}

void LinearImpl::add_lora(int64_t r, double alpha, double dropout) {
  if (r < 1) throw std::invalid_argument("LoRA rank r is " + std::to_string(r) + ", expected 1 or more");
  if (lora_A) throw std::invalid_argument("this Linear has a LoRA adapter already");
  const auto options = weight.options();
  // PEFT's shapes whatever the base layout (its fan_in_fan_out transposes only the merged product).
  lora_A = register_module("lora_A", std::make_shared<LinearImpl>(matrix().size(1), r, false, options));
  lora_B = register_module("lora_B", std::make_shared<LinearImpl>(r, matrix().size(0), false, options));
  lora_scale = alpha / static_cast<double>(r);
  lora_dropout = dropout;
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_, const torch::TensorOptions& options, bool with_bias)
    : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
  if (with_bias) bias = register_parameter("bias", at::empty({dim}, options));
}

at::Tensor LayerNormImpl::forward_impl(const at::Tensor& x) {
  return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, const torch::TensorOptions& options) : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNormImpl::forward_impl(const at::Tensor& x) {
  at::Tensor x32 = x.to(at::kFloat);
  at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return weight * normed.to(weight.scalar_type());
}

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim, const torch::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({num, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

Conv2dImpl::Conv2dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride_, int64_t padding_,
                       const torch::TensorOptions& options)
    : stride(stride_), padding(padding_) {
  weight = register_parameter("weight", at::empty({out_channels, in_channels, kernel, kernel}, options));
  bias = register_parameter("bias", at::empty({out_channels}, options));
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  return at::conv2d(x, weight, bias, {stride, stride}, {padding, padding});
}

bool is_norm_layer(const torch::nn::Module& module) {
  return dynamic_cast<const LayerNormImpl*>(&module) != nullptr || dynamic_cast<const RMSNormImpl*>(&module) != nullptr;
}

}  // namespace shardtrain::models
