// FLAVA (Singh et al.) for pretraining, as Hugging Face's FlavaForPreTraining and TorchMultimodal's
// flava_model_for_pretraining define it: a ViT image encoder, a BERT-style text encoder and a multimodal encoder
// over the projected image and text hidden states (with its own CLS token), all of pre-norm "FlavaLayer"s; the
// frozen image codebook that turns images into visual tokens; and six objectives — masked image modelling (MIM,
// image-only batches), masked language modelling (MLM, text-only batches), and for image-text batches image-text
// matching (ITM), masked multimodal modelling of image and text (MMM) and the global contrastive loss.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/embeddings.h"
#include "shardtrain/models/flava_codebook.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct FlavaLossWeights {
  double mim = 1.0, mlm = 1.0, itm = 1.0, global_contrastive = 1.0, mmm_image = 1.0, mmm_text = 1.0;
};

struct FlavaConfig {
  int64_t dim = 768;       // hidden size of all three encoders and the projections
  int64_t mlp_dim = 3072;
  int64_t heads = 12;
  int64_t unimodal_layers = 12;   // in the image encoder and in the text encoder
  int64_t multimodal_layers = 6;
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t vocab_size = 30522;
  int64_t max_positions = 512;
  int64_t type_vocab_size = 2;
  double norm_eps = 1e-12;
  double dropout = 0.0;
  double logit_scale_init = 2.6592;  // log(1 / 0.07)
  CodebookConfig codebook;           // its vocab_size is the number of visual tokens (MIM classes)
  FlavaLossWeights weights;
};

// flava-350m (the original), flava-900m, flava-1.8b, flava-2.7b, flava-4.8b, flava-10b (the FLAVA scaling post's
// table), flava-debug (trains in seconds on CPU).
std::vector<std::string> flava_flavors();
FlavaConfig flava_flavor(const std::string& name);
TransformerLayerOptions flava_layer_options(const FlavaConfig& config);  // every encoder's FlavaLayer (pre-norm)

// One encoder. Text: embeddings (TextEmbeddings); image: embeddings (PatchEmbeddings with a mask token);
// multimodal: cls_token (1, 1, C). Then layers.N ("FlavaLayer"), norm, pooler.
class FlavaEncoderImpl : public torch::nn::Module {
 public:
  enum class Kind { kText, kImage, kMultimodal };
  FlavaEncoderImpl(Kind kind, const FlavaConfig& config, const std::string& qualified_name, const BuildOptions& build,
                   std::vector<std::string>& built);
  struct Output {
    at::Tensor last;    // (B, L, C) the last layer's output before the final norm (what FLAVA projects onward)
    at::Tensor hidden;  // (B, L, C) after the final norm
  };
  // text: (input_ids, attention_mask); image: (pixels, masked_patches); multimodal: (hidden (B, L, C), mask).
  Output forward(const at::Tensor& input, const at::Tensor& mask);

  Kind kind;
  TextEmbeddings text_embeddings{nullptr};
  PatchEmbeddings image_embeddings{nullptr};
  at::Tensor cls_token;
  std::vector<TransformerLayer> layers;
  LayerNorm norm{nullptr};
  Linear pooler{nullptr};
};
TORCH_MODULE(FlavaEncoder);

// Transform (dense, GELU, norm) then decoder to `classes` with a separate bias: BERT's prediction head.
class FlavaMaskedHeadImpl : public torch::nn::Module {
 public:
  FlavaMaskedHeadImpl(int64_t dim, int64_t classes, double eps, const torch::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // (..., C) -> (..., classes)
  Linear transform{nullptr}, decoder{nullptr};
  LayerNorm norm{nullptr};
  at::Tensor bias;
};
TORCH_MODULE(FlavaMaskedHead);

// A batch; what a batch lacks is undefined. Text-only (input ids), image-only (pixels) and image-text batches.
struct FlavaBatch {
  at::Tensor input_ids;         // (B, T) int64
  at::Tensor input_ids_masked;  // (B, T) with masked tokens replaced ([MASK]); undefined: input_ids
  at::Tensor attention_mask;    // (B, T) 1 = token, 0 = padding
  at::Tensor pixels;            // (B, 3, image_size, image_size), normalised
  at::Tensor codebook_pixels;   // (B, 3, 8 * image_size / patch_size, ...) in [0, 1]: MIM targets come from these
  at::Tensor masked_patches;    // (B, N) bool: patches replaced by the mask token
  at::Tensor mlm_labels;        // (B, T): the original token where masked, -100 elsewhere
  at::Tensor mim_labels;        // (B, N) visual tokens; undefined: the codebook's tokens of codebook_pixels
  at::Tensor itm_labels;        // (B) 1 = the image matches the text, 0 = an in-batch negative
};

struct FlavaOutputs {
  at::Tensor loss;  // () weighted sum of the losses present
  at::Tensor mim, mlm, itm, global_contrastive, mmm_image, mmm_text;  // () each, undefined when not computed
  at::Tensor itm_logits;         // (B, 2)
  at::Tensor logits_per_image;   // (B', W*B) contrastive logits (B' = matching pairs when itm_labels are given)
  at::Tensor logits_per_text;
  at::Tensor image_embedding;    // (B, C) normalised projection of the unmasked image CLS
  at::Tensor text_embedding;     // (B, C) normalised projection of the unmasked text CLS
  static auto fields() {  // forward_impl's tensors, in order (named_outputs.h)
    using O = FlavaOutputs;
    return std::make_tuple(&O::loss, &O::mim, &O::mlm, &O::itm, &O::global_contrastive, &O::mmm_image, &O::mmm_text,
                           &O::itm_logits, &O::logits_per_image, &O::logits_per_text, &O::image_embedding,
                           &O::text_embedding);
  }
};

// Children: text, image, multimodal (FlavaEncoder), image_projection, text_projection, image_to_mm_projection,
// text_to_mm_projection, mim_head, mlm_head, mmm_image_head, mmm_text_head, itm_head_pooler, itm_head,
// image_codebook; parameter logit_scale.
class FlavaImpl : public nn::Interceptable<FlavaImpl, std::vector<at::Tensor>(at::Tensor, at::Tensor, at::Tensor,
                                                                               at::Tensor, at::Tensor, at::Tensor,
                                                                               at::Tensor, at::Tensor, at::Tensor)> {
 public:
  FlavaImpl(const FlavaConfig& config, const BuildOptions& build = {});
  FlavaOutputs run(const FlavaBatch& batch);
  // The FlavaBatch fields in declaration order; returns FlavaOutputs::fields().
  std::vector<at::Tensor> forward_impl(const at::Tensor& input_ids, const at::Tensor& input_ids_masked,
                                       const at::Tensor& attention_mask, const at::Tensor& pixels,
                                       const at::Tensor& codebook_pixels, const at::Tensor& masked_patches,
                                       const at::Tensor& mlm_labels, const at::Tensor& mim_labels,
                                       const at::Tensor& itm_labels);
  // The global contrastive loss gathers embeddings over `group` (the data-parallel world). Unset: this process.
  void set_contrastive_group(std::optional<dist::Communicator> group) { contrastive_group_ = std::move(group); }

  FlavaConfig config;
  FlavaEncoder text{nullptr}, image{nullptr}, multimodal{nullptr};
  Linear image_projection{nullptr}, text_projection{nullptr}, image_to_mm_projection{nullptr},
      text_to_mm_projection{nullptr};
  FlavaMaskedHead mim_head{nullptr}, mlm_head{nullptr}, mmm_image_head{nullptr}, mmm_text_head{nullptr};
  Linear itm_head_pooler{nullptr}, itm_head{nullptr};
  FlavaCodebook image_codebook{nullptr};
  at::Tensor logit_scale;

 private:
  // The global contrastive objective into `out`: embeddings from the unmasked passes' CLS positions (`text_cls`,
  // `image_cls`: [B, hidden]), logits over every rank's of contrastive_group_, the rows of `matching_rows` (ITM's
  // positive pairs) only when defined.
  void add_contrastive(FlavaOutputs& out, const at::Tensor& text_cls, const at::Tensor& image_cls,
                       const at::Tensor& matching_rows);

  std::optional<dist::Communicator> contrastive_group_;
};
TORCH_MODULE(Flava);

NameMap flava_names();

}  // namespace shardtrain::models
