#include "shardtrain/models/vit.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "models/layer_names.h"
#include "models/unknown_flavor.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"

namespace shardtrain::models {

std::vector<std::string> vit_flavors() {
  return {"vit-base-patch16-224", "vit-large-patch16-224", "vit-huge-patch14-224", "vit-debug"};
}

VitConfig vit_flavor(const std::string& name) {
  VitConfig c;  // vit-base-patch16-224
  if (name == "vit-base-patch16-224") return c;
  if (name == "vit-large-patch16-224") {
    c.dim = 1024, c.layers = 24, c.heads = 16, c.mlp_dim = 4096;
    return c;
  }
  if (name == "vit-huge-patch14-224") {
    c.patch_size = 14, c.dim = 1280, c.layers = 32, c.heads = 16, c.mlp_dim = 5120;
    c.num_labels = 0, c.pooler = true;
    return c;
  }
  if (name == "vit-debug") {
    c.image_size = 32, c.patch_size = 8, c.dim = 32, c.layers = 2, c.heads = 4, c.mlp_dim = 64, c.num_labels = 10;
    return c;
  }
  throw_unknown_flavor("ViT", name, vit_flavors());
}

TransformerLayerOptions vit_layer_options(const VitConfig& c) {
  TransformerLayerOptions l;
  l.class_name = "ViTLayer";
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.dropout = c.dropout;
  l.attention.re_attention = c.re_attention;
  l.mlp_dim = c.mlp_dim, l.norm_eps = c.norm_eps, l.dropout = c.dropout;
  return l;
}

VitImpl::VitImpl(const VitConfig& c, const BuildOptions& build) : Interceptable("ViT"), config(c) {
  const auto& t = build.tensors;
  PatchEmbeddingOptions e;
  e.image_size = c.image_size, e.patch_size = c.patch_size, e.channels = c.channels, e.dim = c.dim;
  e.dropout = c.dropout;
  embeddings = register_module("embeddings", PatchEmbeddings(e, t));
  std::vector<std::string> built;
  layers = build_layers(*this, "layers", "layers", c.layers, vit_layer_options(c), build, built);
  norm = register_module("norm", LayerNorm(c.dim, c.norm_eps, t));
  if (c.pooler) pooler = register_module("pooler", Linear(c.dim, c.dim, true, t));
  if (c.num_labels > 0) classifier = register_module("classifier", Linear(c.dim, c.num_labels, true, t));
  finish_model(build, *this, built);
}

VitOutputs VitImpl::run(const at::Tensor& pixels, const at::Tensor& labels, bool cls_only) {
  return from_tensors<VitOutputs>(forward(pixels, labels, cls_only));
}

std::vector<at::Tensor> VitImpl::forward_impl(const at::Tensor& pixels, const at::Tensor& labels, bool cls_only) {
  at::Tensor x = embeddings->forward(pixels, {});
  const at::Tensor none;
  for (size_t i = 0; i < layers.size(); ++i) {
    x = layers[i]->forward(x, none, none, none, none, cls_only && i + 1 == layers.size() ? 1 : 0);
  }
  VitOutputs out;
  out.hidden = norm->forward(x);
  at::Tensor &pooled = out.pooled, &logits = out.logits, &loss = out.loss;
  x = out.hidden;
  if (pooler) pooled = at::tanh(pooler->forward(x.select(1, 0)));
  if (classifier) {
    logits = classifier->forward(x.select(1, 0));
    if (labels.defined()) loss = classifier_loss(logits, labels);
  } else if (labels.defined()) {
    throw std::invalid_argument("ViT: labels given to a model built without a classifier (num_labels = 0)");
  }
  return as_tensors(out);
}

NameMap vit_names() {
  NameRules rules = {
      {"^embeddings\\.cls_token$", "vit.embeddings.cls_token"},
      {"^embeddings\\.mask_token$", "vit.embeddings.mask_token"},
      {"^embeddings\\.position$", "vit.embeddings.position_embeddings"},
      prefix_rule("embeddings.patch", "vit.embeddings.patch_embeddings.projection"),
      prefix_rule("norm", "vit.layernorm"),
      prefix_rule("pooler", "vit.pooler.dense"),
      {"^layers\\.(\\d+)\\.attn\\.reattn_weights$", "vit.encoder.layer.$1.attention.attention.reattn_weights"},
  };
  NameRules subpaths = vit_layer_subpaths();
  subpaths.emplace_back("attn.reattn_norm", "attention.attention.reattn_norm");
  append(rules, layer_rules("layers", "vit.encoder.layer", subpaths));
  // Heads (fine-tuning moves between them, weights.h): ViTForImageClassification's classifier, ViTModel's pooler.
  return NameMap(rules, {}, {}, {"^classifier\\..*$", "^(vit\\.)?pooler\\..*$"});
}

}  // namespace shardtrain::models
