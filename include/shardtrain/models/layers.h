// The leaf layers every model of the zoo is built from. Unlike torch::nn's, they create their parameters with the
// caller's TensorOptions, so a whole model can be built on the meta device (shapes only, nothing allocated: how
// `shardtrain models` counts flava-10b's parameters) or directly in the dtype and on the device it will run on.
// Parameters are left uninitialised (torch::empty); models::init_parameters fills them.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

namespace shardtrain::models {

// y = x W^T + b. weight (out, in), bias (out).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // (..., in) -> (..., out)
  at::Tensor weight, bias;                          // bias undefined when built without
};
TORCH_MODULE(Linear);

// Normalisation over the last dimension: weight (dim), bias (dim) when affine.
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps, const torch::TensorOptions& options, bool bias = true);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// Root-mean-square normalisation (Llama's RMSNorm, T5's LayerNorm): x / rms(x) * weight, the statistic taken in
// float32 whatever the input dtype, as Hugging Face does.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Lookup table: weight (num, dim). ids (...) int64 -> (..., dim).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num, int64_t dim, const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
};
TORCH_MODULE(Embedding);

// 2-d convolution, square kernel: weight (out, in, k, k), bias (out).
class Conv2dImpl : public torch::nn::Module {
 public:
  Conv2dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding,
             const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // (B, in, H, W) -> (B, out, H', W')
  at::Tensor weight, bias;
  int64_t stride, padding;
};
TORCH_MODULE(Conv2d);

// True for the layers whose `weight` is a scale (initialised to one) rather than a projection.
bool is_norm_layer(const torch::nn::Module& module);

}  // namespace shardtrain::models
