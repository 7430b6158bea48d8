#include "shardtrain/models/flava.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "models/layer_names.h"
#include "models/unknown_flavor.h"
#include "shardtrain/models/contrastive.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"

namespace shardtrain::models {

namespace {

constexpr double kLogitScaleMax = 4.6052;  // log(100): FLAVA clamps the contrastive temperature to [1, 100]

// Cross-entropy of head(seq) at the positions whose label is not ignored (the head runs on those rows only).
// seq (B, L, C), labels (B, L).
at::Tensor selected_cross_entropy(FlavaMaskedHead& head, const at::Tensor& seq, const at::Tensor& labels) {
  const LabelledRows labelled = labelled_rows(seq, labels);
  if (labelled.labels.numel() == 0) return seq.sum() * 0.0;  // nothing masked: no loss, graph kept
  return masked_cross_entropy(head->forward(labelled.hidden), labelled.labels);
}

// torch.nn.functional.normalize over the last dimension.
at::Tensor l2_normalize(const at::Tensor& x) { return x / x.norm(2, {-1}, /*keepdim=*/true).clamp_min(1e-12); }

// t's rows `rows`; all of t when rows is undefined (no selection).
at::Tensor select_rows(const at::Tensor& t, const at::Tensor& rows) {
  return t.defined() && rows.defined() ? t.index_select(0, rows) : t;
}

}  // namespace

TransformerLayerOptions flava_layer_options(const FlavaConfig& c) {
  TransformerLayerOptions l;
  l.class_name = "FlavaLayer";
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.dropout = c.dropout;
  l.mlp_dim = c.mlp_dim, l.norm_eps = c.norm_eps, l.dropout = c.dropout;
  return l;
}

std::vector<std::string> flava_flavors() {
  return {"flava-350m", "flava-900m", "flava-1.8b", "flava-2.7b", "flava-4.8b", "flava-10b", "flava-debug"};
}

FlavaConfig flava_flavor(const std::string& name) {
  FlavaConfig c;  // flava-350m
  auto scale = [&c](int64_t dim, int64_t mlp, int64_t heads, int64_t unimodal, int64_t multimodal) {
    c.dim = dim, c.mlp_dim = mlp, c.heads = heads, c.unimodal_layers = unimodal, c.multimodal_layers = multimodal;
    return c;
  };
  // The FLAVA scaling post's table: hidden size, MLP size, heads, unimodal layers, multimodal layers.
  if (name == "flava-350m") return c;
  if (name == "flava-900m") return scale(1024, 4096, 16, 24, 12);
  if (name == "flava-1.8b") return scale(1280, 5120, 16, 32, 16);
  if (name == "flava-2.7b") return scale(1408, 6144, 16, 40, 20);
  if (name == "flava-4.8b") return scale(1664, 8192, 16, 48, 24);
  if (name == "flava-10b") return scale(2048, 10240, 16, 64, 40);
  if (name == "flava-debug") {
    scale(32, 64, 4, 2, 1);
    c.image_size = 32, c.patch_size = 8, c.vocab_size = 1000, c.max_positions = 64;
    c.codebook.hidden_size = 16, c.codebook.blocks_per_group = 1, c.codebook.vocab_size = 64;
    return c;
  }
  throw_unknown_flavor("FLAVA", name, flava_flavors());
}

FlavaEncoderImpl::FlavaEncoderImpl(Kind k, const FlavaConfig& c, const std::string& qualified_name,
                                   const BuildOptions& build, std::vector<std::string>& built)
    : kind(k) {
  const auto& t = build.tensors;
  if (kind == Kind::kText) {
    TextEmbeddingOptions e;
    e.vocab_size = c.vocab_size, e.max_positions = c.max_positions, e.type_vocab_size = c.type_vocab_size;
    e.dim = c.dim, e.norm_eps = c.norm_eps, e.dropout = c.dropout;
    text_embeddings = register_module("text_embeddings", TextEmbeddings(e, t));
  } else if (kind == Kind::kImage) {
    PatchEmbeddingOptions e;
    e.image_size = c.image_size, e.patch_size = c.patch_size, e.dim = c.dim, e.mask_token = true;
    e.dropout = c.dropout;
    image_embeddings = register_module("image_embeddings", PatchEmbeddings(e, t));
  } else {
    cls_token = register_parameter("cls_token", at::empty({1, 1, c.dim}, t));
  }
  const int64_t count = kind == Kind::kMultimodal ? c.multimodal_layers : c.unimodal_layers;
  layers = build_layers(*this, "layers", qualified_name + ".layers", count, flava_layer_options(c), build, built);
  norm = register_module("norm", LayerNorm(c.dim, c.norm_eps, t));
  pooler = register_module("pooler", Linear(c.dim, c.dim, true, t));
}

FlavaEncoderImpl::Output FlavaEncoderImpl::forward(const at::Tensor& input, const at::Tensor& mask) {
  at::Tensor x;
  if (kind == Kind::kText) {
    x = text_embeddings->forward(input, {});
  } else if (kind == Kind::kImage) {
    x = image_embeddings->forward(input, mask);
  } else {
    x = at::cat({cls_token.expand({input.size(0), 1, -1}), input}, 1);
  }
  const bool padded = kind != Kind::kImage && mask.defined();
  at::Tensor last = run_layers(layers, x, padded ? padding_bias_if_padded(mask, attention_dtype(x)) : at::Tensor());
  return {last, norm->forward(last)};
}

FlavaMaskedHeadImpl::FlavaMaskedHeadImpl(int64_t dim, int64_t classes, double eps, const torch::TensorOptions& t) {
  transform = register_module("transform", Linear(dim, dim, true, t));
  norm = register_module("norm", LayerNorm(dim, eps, t));
  decoder = register_module("decoder", Linear(dim, classes, false, t));
  bias = register_parameter("bias", at::empty({classes}, t));
}

at::Tensor FlavaMaskedHeadImpl::forward(const at::Tensor& x) {
  return decoder->forward(norm->forward(at::gelu(transform->forward(x)))) + bias;
}

FlavaImpl::FlavaImpl(const FlavaConfig& c, const BuildOptions& build) : Interceptable("Flava"), config(c) {
  const auto& t = build.tensors;
  std::vector<std::string> built;
  using Kind = FlavaEncoderImpl::Kind;
  text = register_module("text", FlavaEncoder(Kind::kText, c, "text", build, built));
  image = register_module("image", FlavaEncoder(Kind::kImage, c, "image", build, built));
  multimodal = register_module("multimodal", FlavaEncoder(Kind::kMultimodal, c, "multimodal", build, built));
  image_projection = register_module("image_projection", Linear(c.dim, c.dim, true, t));
  text_projection = register_module("text_projection", Linear(c.dim, c.dim, true, t));
  image_to_mm_projection = register_module("image_to_mm_projection", Linear(c.dim, c.dim, true, t));
  text_to_mm_projection = register_module("text_to_mm_projection", Linear(c.dim, c.dim, true, t));
  mim_head = register_module("mim_head", FlavaMaskedHead(c.dim, c.codebook.vocab_size, c.norm_eps, t));
  mlm_head = register_module("mlm_head", FlavaMaskedHead(c.dim, c.vocab_size, c.norm_eps, t));
  mmm_image_head = register_module("mmm_image_head", FlavaMaskedHead(c.dim, c.codebook.vocab_size, c.norm_eps, t));
  mmm_text_head = register_module("mmm_text_head", FlavaMaskedHead(c.dim, c.vocab_size, c.norm_eps, t));
  itm_head_pooler = register_module("itm_head_pooler", Linear(c.dim, c.dim, true, t));
  itm_head = register_module("itm_head", Linear(c.dim, 2, true, t));
  image_codebook = register_module("image_codebook", FlavaCodebook(c.codebook, t));
  logit_scale = register_parameter("logit_scale", at::empty({}, t));
  finish_model(build, *this, built);
  fill_constant(logit_scale, c.logit_scale_init);
}

FlavaOutputs FlavaImpl::run(const FlavaBatch& b) {
  return from_tensors<FlavaOutputs>(forward(b.input_ids, b.input_ids_masked, b.attention_mask, b.pixels,
                                            b.codebook_pixels, b.masked_patches, b.mlm_labels, b.mim_labels,
                                            b.itm_labels));
}

void FlavaImpl::add_contrastive(FlavaOutputs& out, const at::Tensor& text_cls, const at::Tensor& image_cls,
                                const at::Tensor& matching_rows) {
  out.text_embedding = l2_normalize(text_projection->forward(text_cls));
  out.image_embedding = l2_normalize(image_projection->forward(image_cls));
  // In training the temperature is clamped to [1, 100] (FLAVA clamps the parameter in place; here the forward
  // value is clamped and the gradient passes straight through, which keeps the sharded parameter untouched).
  at::Tensor scale = logit_scale;
  if (is_training()) scale = logit_scale + (logit_scale.clamp(0.0, kLogitScaleMax) - logit_scale).detach();
  ContrastiveLogits logits = global_contrastive_logits(out.image_embedding, out.text_embedding, scale,
                                                       contrastive_group_);
  if (matching_rows.defined()) {
    logits.per_image = logits.per_image.index_select(0, matching_rows);
    logits.per_text = logits.per_text.index_select(0, matching_rows);
    logits.labels = logits.labels.index_select(0, matching_rows);
  }
  out.logits_per_image = logits.per_image;
  out.logits_per_text = logits.per_text;
  out.global_contrastive = (at::cross_entropy_loss(logits.per_image.to(at::kFloat), logits.labels) +
                            at::cross_entropy_loss(logits.per_text.to(at::kFloat), logits.labels)) /
                           2 * config.weights.global_contrastive;
}

std::vector<at::Tensor> FlavaImpl::forward_impl(const at::Tensor& input_ids, const at::Tensor& input_ids_masked,
                                                const at::Tensor& attention_mask, const at::Tensor& pixels,
                                                const at::Tensor& codebook_pixels, const at::Tensor& masked_patches,
                                                const at::Tensor& mlm_labels, const at::Tensor& mim_labels,
                                                const at::Tensor& itm_labels) {
  const bool has_text = input_ids.defined(), has_image = pixels.defined();
  if (!has_text && !has_image) throw std::invalid_argument("FLAVA: a batch needs input_ids, pixels or both");
  const FlavaLossWeights& w = config.weights;
  const bool multimodal_batch = has_text && has_image;

  const int64_t batch = has_image ? pixels.size(0) : input_ids.size(0);

  // With ITM labels the multimodal objectives read the matching pairs only (every row when none match).
  at::Tensor matching_rows;
  if (multimodal_batch && w.itm > 0 && itm_labels.defined()) {
    at::Tensor positive = itm_labels != 0;
    matching_rows = (positive | ~positive.any()).nonzero().squeeze(1);
  }

  // Visual-token targets of the masked patches (ignored elsewhere), for the rows that read them: the frozen
  // codebook runs on those images only, its last convolution at their masked patches only. First, while no
  // encoder keeps anything yet: its activations (and, sharded, its gathered parameters) never meet theirs.
  at::Tensor mim_targets;
  const bool wants_mim = has_image && masked_patches.defined() && (multimodal_batch ? w.mmm_image > 0 : w.mim > 0);
  if (wants_mim) {
    const at::Tensor masked = select_rows(masked_patches.reshape({batch, -1}), matching_rows);
    if (mim_labels.defined()) {
      mim_targets = select_rows(mim_labels.reshape({batch, -1}), matching_rows);
    } else if (codebook_pixels.defined()) {
      mim_targets = image_codebook->tokens(select_rows(codebook_pixels, matching_rows), masked);
    } else {
      throw std::invalid_argument("FLAVA: masked patches need mim_labels or codebook_pixels to make them");
    }
    mim_targets = mim_targets.masked_fill(~masked, kIgnoreIndex);
  }

  // Unmasked pass (contrastive embeddings) and masked pass (every other objective), as FlavaForPreTraining runs
  // them; a pass whose inputs carry no mask is the unmasked one, and the unmasked pass of masked inputs runs only
  // when the contrastive loss needs it.
  const bool contrastive = multimodal_batch && w.global_contrastive > 0;
  FlavaEncoderImpl::Output img, txt, img_m, txt_m, mm_m;
  if (has_image) {
    const bool masked = masked_patches.defined();
    if (!masked || contrastive) img = image->forward(pixels, {});
    img_m = masked ? image->forward(pixels, masked_patches) : img;
  }
  if (has_text) {
    const bool masked = input_ids_masked.defined();
    if (!masked || contrastive) txt = text->forward(input_ids, attention_mask);
    txt_m = masked ? text->forward(input_ids_masked, attention_mask) : txt;
  }
  if (multimodal_batch) {
    at::Tensor mm_input = at::cat({image_to_mm_projection->forward(img_m.last), text_to_mm_projection->forward(txt_m.last)}, 1);
    at::Tensor mm_mask;
    if (attention_mask.defined()) {  // the multimodal CLS and every image position are always attended
      auto f32 = attention_mask.options().dtype(at::kFloat);
      mm_mask = at::cat({at::ones({batch, img_m.last.size(1) + 1}, f32), attention_mask.to(at::kFloat)}, 1);
    }
    mm_m = multimodal->forward(mm_input, mm_mask);
  }

  FlavaOutputs out;
  if (!multimodal_batch && mim_targets.defined() && w.mim > 0) {
    const int64_t n = mim_targets.size(1);
    out.mim = selected_cross_entropy(mim_head, img_m.hidden.narrow(1, img_m.hidden.size(1) - n, n), mim_targets) * w.mim;
  }
  if (!multimodal_batch && has_text && mlm_labels.defined() && w.mlm > 0) {
    const int64_t t = mlm_labels.size(1);
    out.mlm = selected_cross_entropy(mlm_head, txt_m.hidden.narrow(1, txt_m.hidden.size(1) - t, t), mlm_labels) * w.mlm;
  }

  if (multimodal_batch) {
    at::Tensor mm = mm_m.hidden, mlm_targets = mlm_labels;
    if (w.itm > 0) {
      out.itm_logits = itm_head->forward(at::tanh(itm_head_pooler->forward(mm.select(1, 0))));
      if (matching_rows.defined()) {
        out.itm = at::cross_entropy_loss(out.itm_logits.to(at::kFloat), itm_labels) * w.itm;
        mm = mm.index_select(0, matching_rows);
        mlm_targets = select_rows(mlm_targets, matching_rows);
      }
    }
    if (w.mmm_image > 0 && mim_targets.defined()) {
      const int64_t patches = img_m.hidden.size(1) - 1;  // after the multimodal and the image CLS
      out.mmm_image = selected_cross_entropy(mmm_image_head, mm.narrow(1, 2, patches), mim_targets) * w.mmm_image;
    }
    if (w.mmm_text > 0 && mlm_targets.defined()) {
      const int64_t t = txt_m.hidden.size(1);
      out.mmm_text = selected_cross_entropy(mmm_text_head, mm.narrow(1, mm.size(1) - t, t), mlm_targets) * w.mmm_text;
    }
  }

  if (contrastive) add_contrastive(out, txt.hidden.select(1, 0), img.hidden.select(1, 0), matching_rows);

  for (const at::Tensor* l : {&out.mim, &out.mlm, &out.itm, &out.global_contrastive, &out.mmm_image, &out.mmm_text}) {
    if (l->defined()) out.loss = out.loss.defined() ? out.loss + *l : *l;
  }
  return as_tensors(out);
}

NameMap flava_names() {
  NameRules rules = {
      prefix_rule("text.text_embeddings.word", "flava.text_model.embeddings.word_embeddings"),
      prefix_rule("text.text_embeddings.position", "flava.text_model.embeddings.position_embeddings"),
      prefix_rule("text.text_embeddings.token_type", "flava.text_model.embeddings.token_type_embeddings"),
      prefix_rule("text.text_embeddings.norm", "flava.text_model.embeddings.LayerNorm"),
      {"^image\\.image_embeddings\\.(cls_token|mask_token)$", "flava.image_model.embeddings.$1"},
      {"^image\\.image_embeddings\\.position$", "flava.image_model.embeddings.position_embeddings"},
      prefix_rule("image.image_embeddings.patch", "flava.image_model.embeddings.patch_embeddings.projection"),
      {"^multimodal\\.cls_token$", "flava.multimodal_model.cls_token"},
      {"^(text|image|multimodal)\\.norm\\.(.*)$", "flava.$1_model.layernorm.$2"},
      {"^(text|image|multimodal)\\.pooler\\.(.*)$", "flava.$1_model.pooler.dense.$2"},
      {"^((image|text)(_to_mm)?_projection)\\.(.*)$", "flava.$1.$4"},
      {"^logit_scale$", "flava.logit_scale"},
      {"^(mim_head|mlm_head|mmm_image_head|mmm_text_head)\\.transform\\.(.*)$", "$1.transform.dense.$2"},
      {"^(mim_head|mlm_head|mmm_image_head|mmm_text_head)\\.norm\\.(.*)$", "$1.transform.LayerNorm.$2"},
      prefix_rule("itm_head_pooler", "itm_head.pooler.dense"),
      prefix_rule("itm_head", "itm_head.seq_relationship"),
  };
  for (const char* encoder : {"text", "image", "multimodal"}) {
    append(rules, layer_rules(std::string(encoder) + ".layers",
                              "flava." + std::string(encoder) + "_model.encoder.layer", vit_layer_subpaths()));
  }
  // The heads' decoder biases are their `bias` (saved under either name); the text model's id buffers are not
  // weights.
  return NameMap(rules,
                 {"^(mim_head|mlm_head|mmm_image_head|mmm_text_head)\\.decoder\\.bias$",
                  "^flava\\.text_model\\.embeddings\\.(position_ids|token_type_ids)$"},
                 {{"^(mim_head|mlm_head|mmm_image_head|mmm_text_head)\\.bias$", "$1.decoder.bias"}});
}

}  // namespace shardtrain::models
