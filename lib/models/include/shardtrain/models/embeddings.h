// Input embeddings: BERT-style token embeddings (text) and ViT-style patch embeddings (images).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

#include "shardtrain/models/layers.h"

namespace shardtrain::models {

struct TextEmbeddingOptions {
  int64_t vocab_size = 30522;
  int64_t max_positions = 512;
  int64_t type_vocab_size = 2;  // 0: no token-type table
  int64_t dim = 768;
  double norm_eps = 1e-12;
  double dropout = 0.0;
};

// norm(word[ids] + position[0..T) + token_type[types]). Children: word, position, token_type, norm.
class TextEmbeddingsImpl : public torch::nn::Module {
 public:
  TextEmbeddingsImpl(const TextEmbeddingOptions& options, const torch::TensorOptions& tensor_options);
  // input_ids (B, T) int64; token_type_ids (B, T) or undefined (all zero). Returns (B, T, C). tied_word: the word
  // table's TiedTable::lookups when an output projection shares it (rows then looked up with sparse_lookup()).
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                     const at::Tensor& tied_word = at::Tensor());

  TextEmbeddingOptions options;
  Embedding word{nullptr}, position{nullptr}, token_type{nullptr};
  LayerNorm norm{nullptr};
};
TORCH_MODULE(TextEmbeddings);

struct PatchEmbeddingOptions {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t channels = 3;
  int64_t dim = 768;
  bool mask_token = false;  // a learned token that replaces masked patches (masked image modelling)
  double dropout = 0.0;
};

// [cls; patches] + position. Children: patch (the (C, channels, P, P) convolution); parameters cls_token (1, 1, C),
// position (1, N+1, C) with N = (image_size / patch_size)^2, mask_token (1, 1, C) when enabled.
class PatchEmbeddingsImpl : public torch::nn::Module {
 public:
  PatchEmbeddingsImpl(const PatchEmbeddingOptions& options, const torch::TensorOptions& tensor_options);
  // pixels (B, channels, H, W) with H = W = image_size; masked_patches (B, N) bool or undefined. Returns (B, N+1, C).
  at::Tensor forward(const at::Tensor& pixels, const at::Tensor& masked_patches);
  int64_t num_patches() const;

  PatchEmbeddingOptions options;
  Conv2d patch{nullptr};
  at::Tensor cls_token, position, mask_token;
};
TORCH_MODULE(PatchEmbeddings);

}  // namespace shardtrain::models
