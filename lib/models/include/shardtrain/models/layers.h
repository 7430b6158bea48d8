// The leaf layers every model of the zoo is built from. Unlike torch::nn's, they create their parameters with the
// caller's TensorOptions, so a whole model can be built on the meta device (shapes only, nothing allocated: how
// `shardtrain models` counts flava-10b's parameters) or directly in the dtype and on the device it will run on.
// Parameters are left uninitialised (torch::empty); models::init_parameters fills them.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/nn/float8_linear.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::models {

// y = x W^T + b. weight (out, in), bias (out); transposed: weight (in, out), y = x W + b, as Hugging Face's Conv1D
// (GPT-2) stores it, so that its files load, shard by rows and save as they are.
// Under the tensorwise float8 recipe its weight can be gathered already cast (nn::Float8CastAhead: FSDP's float8
// all-gather).
class LinearImpl : public torch::nn::Module, public nn::Float8CastAhead {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const torch::TensorOptions& options,
             bool transposed = false);
  at::Tensor forward(const at::Tensor& x);  // (..., in) -> (..., out)
  at::Tensor matrix() const { return transposed ? weight.t() : weight; }  // (out, in) either way (a view)
  at::Tensor weight, bias;                          // bias undefined when built without
  bool transposed = false;

  // A low-rank adapter (LoRA, Hu et al. 2021, as PEFT's lora.Linear): children lora_A (weight (r, in)) and lora_B
  // (weight (out, r)), and forward adds dropout(x) A^T B^T * scale, scale = alpha / r. Uninitialised, like every
  // parameter here (models/lora.h initialises them). Throws std::invalid_argument for r < 1 or a second adapter.
  void add_lora(int64_t r, double alpha, double dropout);
  bool has_lora() const { return lora_A != nullptr; }
  std::shared_ptr<LinearImpl> lora_A, lora_B;  // null without an adapter
  double lora_scale = 0, lora_dropout = 0;

  // Set by tensor parallelism's row-wise split (models/tensor_parallel.h): this rank's product is a partial sum over
  // its slice of the input features, reduced over the group by this before the bias (held whole on every rank) is
  // added. Null otherwise.
  std::function<at::Tensor(const at::Tensor&)> reduce_partial;
  // For code that computes x matrix()^T itself (fused_mlp.h): the bias to add inside that product (undefined when
  // it must wait for the reduction), and what turns the product into the layer's output.
  at::Tensor bias_in_product() const { return reduce_partial ? at::Tensor() : bias; }
  at::Tensor finish_product(const at::Tensor& y) const;

  // Set by models::Float8Layers: the base product's GEMMs in float8 with this recipe (nn/float8_linear.h); an
  // adapter's stay in the activations' dtype. Unset: in the activations' dtype.
  std::optional<parallel::Float8Recipe> float8;
  at::Tensor float8_weight() const override {
    return float8 == parallel::Float8Recipe::TENSORWISE ? weight : at::Tensor();
  }
};
TORCH_MODULE(Linear);

// Normalisation over the last dimension: weight (dim), bias (dim) when affine. Interceptable (tensor parallelism
// gathers a sequence-parallel norm's output).
class LayerNormImpl : public nn::Interceptable<LayerNormImpl, at::Tensor(const at::Tensor&)> {
 public:
  LayerNormImpl(int64_t dim, double eps, const torch::TensorOptions& options, bool bias = true);
  at::Tensor forward_impl(const at::Tensor& x);
  at::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// Root-mean-square normalisation (Llama's RMSNorm, T5's LayerNorm): x / rms(x) * weight, the statistic taken in
// float32 whatever the input dtype, as Hugging Face does. Interceptable, as LayerNorm.
class RMSNormImpl : public nn::Interceptable<RMSNormImpl, at::Tensor(const at::Tensor&)> {
 public:
  RMSNormImpl(int64_t dim, double eps, const torch::TensorOptions& options);
  at::Tensor forward_impl(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// A module whose parameters only lookups read (at::embedding), which autocast never casts: under DDP's mixed
// precision they have no compute-dtype copy (plan/memory_model).
class LookupModule {
 public:
  virtual ~LookupModule() = default;
};

// Lookup table: weight (num, dim). ids (...) int64 -> (..., dim). A model that shares it with its head may split it
// by vocabulary rows under tensor parallelism (VocabParallelTable: the model reads the shard).
class EmbeddingImpl : public torch::nn::Module, public LookupModule, public VocabParallelTable {
 public:
  EmbeddingImpl(int64_t num, int64_t dim, const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight;
};
TORCH_MODULE(Embedding);

// A table shared by lookups and an output projection (BERT's decoder, T5's head), for one forward: read each of
// `lookups` with one sparse_lookup() (T5: the encoder's and the decoder's) and `head` with tied_projection() or
// linear_cross_entropy(). The lookups' gradients are the looked-up rows, added in place into the projection's
// dense gradient, so the two never both exist as dense tables (62.5 MB for BERT's 30522 x 512 at float32); rows
// alone (the projection unused in this backward) become a dense table, so the weight's .grad is always dense.
// `head` must go to those two only: its gradient is written into. Without grad mode all are the weight itself.
struct TiedTable {
  std::vector<at::Tensor> lookups;
  at::Tensor head;
};
// Throws std::invalid_argument for lookups < 1.
TiedTable tie_table(const at::Tensor& weight, int64_t lookups = 1);
// table[ids] with a sparse gradient, table one of a TiedTable's lookups. ids (...) int64 -> (..., dim).
at::Tensor sparse_lookup(const at::Tensor& table, const at::Tensor& ids);
// x (..., dim) -> x table^T + bias (..., num), as at::linear; bias (num) or undefined.
at::Tensor tied_projection(const at::Tensor& x, const at::Tensor& table, const at::Tensor& bias = at::Tensor());

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
