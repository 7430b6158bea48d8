// Vision Transformer (Dosovitskiy et al.), as Hugging Face's ViTModel / ViTForImageClassification, with DeepViT's
// re-attention (Zhou et al.) as an option.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/embeddings.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct VitConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t channels = 3;
  int64_t dim = 768;
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t mlp_dim = 3072;
  double norm_eps = 1e-12;
  double dropout = 0.0;
  int64_t num_labels = 1000;  // classifier over the CLS token; 0: none
  std::vector<std::string> labels;  // the classes' names by id (id2label); empty: transformers' LABEL_0, ...
  bool multi_label = false;  // labels are sets of classes: (B, num_labels) float 0/1, binary cross-entropy each
  bool pooler = false;        // ViTModel's tanh pooler
  bool re_attention = false;  // DeepViT re-attention in every layer
};

// vit-base-patch16-224, vit-large-patch16-224 (ImageNet-1k classifiers), vit-huge-patch14-224 (the in21k encoder
// with pooler), vit-debug.
std::vector<std::string> vit_flavors();
VitConfig vit_flavor(const std::string& name);
TransformerLayerOptions vit_layer_options(const VitConfig& config);  // its ViTLayer (pre-norm, GELU)

struct VitOutputs {
  at::Tensor hidden;  // (B, N+1, C) after the final norm; (B, 1, C), the CLS token's, when run with cls_only
  at::Tensor pooled;  // (B, C) with the pooler
  at::Tensor logits;  // (B, num_labels) with a classifier
  at::Tensor loss;    // () cross-entropy when labels are given (one label: a regression's mean squared error)
  static auto fields() {  // forward_impl's tensors, in order (named_outputs.h)
    return std::make_tuple(&VitOutputs::hidden, &VitOutputs::pooled, &VitOutputs::logits, &VitOutputs::loss);
  }
};

// Children: embeddings, layers.N (class "ViTLayer"), norm, pooler, classifier.
class VitImpl : public nn::Interceptable<VitImpl, std::vector<at::Tensor>(at::Tensor, at::Tensor, bool)> {
 public:
  VitImpl(const VitConfig& config, const BuildOptions& build = {});
  // pixels (B, channels, image_size, image_size); labels (B) int64 (one label: float scores; multi-label: (B,
  // num_labels) float 0/1) or undefined.
  // cls_only: the last layer computes the CLS token only, all the pooler, the classifier and the loss read (the
  // other tokens' keys and values are still computed: the CLS token attends to them): the same outputs, a layer's
  // MLP and most of its attention less.
  VitOutputs run(const at::Tensor& pixels, const at::Tensor& labels = {}, bool cls_only = false);
  std::vector<at::Tensor> forward_impl(const at::Tensor& pixels, const at::Tensor& labels, bool cls_only);

  VitConfig config;
  PatchEmbeddings embeddings{nullptr};
  std::vector<TransformerLayer> layers;
  LayerNorm norm{nullptr};
  Linear pooler{nullptr}, classifier{nullptr};
};
TORCH_MODULE(Vit);

NameMap vit_names();

}  // namespace shardtrain::models
