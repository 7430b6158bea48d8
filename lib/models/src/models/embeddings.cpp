#include "shardtrain/models/embeddings.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace shardtrain::models {

TextEmbeddingsImpl::TextEmbeddingsImpl(const TextEmbeddingOptions& o, const torch::TensorOptions& t) : options(o) {
  word = register_module("word", Embedding(o.vocab_size, o.dim, t));
  position = register_module("position", Embedding(o.max_positions, o.dim, t));
  if (o.type_vocab_size > 0) token_type = register_module("token_type", Embedding(o.type_vocab_size, o.dim, t));
  norm = register_module("norm", LayerNorm(o.dim, o.norm_eps, t));
}

at::Tensor TextEmbeddingsImpl::forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids,
                                       const at::Tensor& tied_word) {
  const int64_t length = input_ids.size(1);
  if (length > options.max_positions) {
    throw std::invalid_argument("text of " + std::to_string(length) + " tokens exceeds the " +
                                std::to_string(options.max_positions) + " positions of the model");
  }
  at::Tensor x = tied_word.defined() ? sparse_lookup(tied_word, input_ids) : word->forward(input_ids);
  // Positions 0..T-1, and token type 0 when no types are given, as slices of their tables: a lookup would keep a
  // (T) and a (B, T) index tensor for backward.
  x = x + position->weight.narrow(0, 0, length).unsqueeze(0);
  if (token_type) {
    x = x + (token_type_ids.defined() ? token_type->forward(token_type_ids) : token_type->weight.select(0, 0));
  }
  x = norm->forward(x);
  return options.dropout > 0 && is_training() ? at::dropout(x, options.dropout, true) : x;
}

PatchEmbeddingsImpl::PatchEmbeddingsImpl(const PatchEmbeddingOptions& o, const torch::TensorOptions& t) : options(o) {
  if (o.patch_size <= 0 || o.image_size % o.patch_size != 0) {
    throw std::invalid_argument("patch embeddings: image_size " + std::to_string(o.image_size) +
                                " is not a multiple of patch_size " + std::to_string(o.patch_size));
  }
  patch = register_module("patch", Conv2d(o.channels, o.dim, o.patch_size, o.patch_size, 0, t));
  cls_token = register_parameter("cls_token", at::empty({1, 1, o.dim}, t));
  if (o.mask_token) mask_token = register_parameter("mask_token", at::empty({1, 1, o.dim}, t));
  position = register_parameter("position", at::empty({1, num_patches() + 1, o.dim}, t));
}

int64_t PatchEmbeddingsImpl::num_patches() const {
  const int64_t side = options.image_size / options.patch_size;
  return side * side;
}

at::Tensor PatchEmbeddingsImpl::forward(const at::Tensor& pixels, const at::Tensor& masked_patches) {
  if (pixels.dim() != 4 || pixels.size(1) != options.channels || pixels.size(2) != options.image_size ||
      pixels.size(3) != options.image_size) {
    throw std::invalid_argument("images must be (batch, " + std::to_string(options.channels) + ", " +
                                std::to_string(options.image_size) + ", " + std::to_string(options.image_size) +
                                "), got " + c10::str(pixels.sizes()));
  }
  const int64_t b = pixels.size(0);
  at::Tensor x = patch->forward(pixels).flatten(2).transpose(1, 2);  // (B, N, C)
  if (masked_patches.defined()) {
    if (!mask_token.defined()) throw std::invalid_argument("patch embeddings: masked patches given, but no mask token");
    at::Tensor w = masked_patches.unsqueeze(-1).to(x.scalar_type());
    x = x * (1 - w) + mask_token.expand({b, x.size(1), -1}) * w;
  }
  x = at::cat({cls_token.expand({b, 1, -1}), x}, 1) + position;
  return options.dropout > 0 && is_training() ? at::dropout(x, options.dropout, true) : x;
}

}  // namespace shardtrain::models
