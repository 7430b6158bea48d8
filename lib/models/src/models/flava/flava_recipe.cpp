// FLAVA's recipe: pretraining on image-text, text-only and image-only batches mixed by data.mix (MIM, MLM, ITM,
// MMM and the global contrastive loss), zero-shot evaluation on held-out image-text pairs, and the contrastive
// loss gathering over the data-parallel world.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "models/activation_model.h"
#include "models/evaluation.h"
#include "models/families.h"
#include "models/hf_config.h"
#include "models/recipe_helpers.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/models/flava.h"

namespace shardtrain::models {
namespace {

// Retrieval R@1 in both directions over the whole evaluated set (embeddings of the unmasked passes, gathered from
// every rank), and image-text matching accuracy on each pair and on a mismatched pair (the text with the next
// sample's image), with the inputs masked as in training: FLAVA's ITM head only ever sees the masked multimodal
// pass, and unmasked inputs are a distribution it was not trained on. Chance: R@1 = 1/N, ITM = 0.5.
// Uses the largest multiple of world * batch_size samples up to max_samples (0: all).
std::map<std::string, double> evaluate_flava(FlavaImpl& flava, const EvalInputs& in) {
  const dist::Communicator& world = *in.world;
  const int64_t W = world.size(), per_step = W * in.batch_size, used = whole_batches(in);
  const EvalMode mode(flava);
  std::vector<at::Tensor> image_embeddings, text_embeddings;
  int64_t itm_correct = 0, itm_total = 0;
  for (int64_t start = 0; start < used; start += per_step) {
    const data::Batch b = in.loader->build(data::SampleKind::IMAGE_TEXT, start).to(in.device, in.floats);
    FlavaBatch fb;
    fb.input_ids = b.input_ids, fb.attention_mask = b.attention_mask, fb.pixels = b.pixels;
    fb.input_ids_masked = b.input_ids_masked, fb.masked_patches = b.masked_patches;
    fb.codebook_pixels = b.codebook_pixels;
    const FlavaOutputs positive = flava.run(fb);
    image_embeddings.push_back(positive.image_embedding);
    text_embeddings.push_back(positive.text_embedding);
    itm_correct += (positive.itm_logits.argmax(1) == 1).sum().item<int64_t>();
    itm_total += b.input_ids.size(0);
    if (b.input_ids.size(0) > 1) {  // each text with the next sample's image
      fb.pixels = b.pixels.roll(1, 0);
      if (fb.masked_patches.defined()) fb.masked_patches = b.masked_patches.roll(1, 0);
      if (fb.codebook_pixels.defined()) fb.codebook_pixels = b.codebook_pixels.roll(1, 0);
      const FlavaOutputs negative = flava.run(fb);
      itm_correct += (negative.itm_logits.argmax(1) == 0).sum().item<int64_t>();
      itm_total += b.input_ids.size(0);
    }
  }

  // Every rank's embeddings, rank-major: (used, C) on every rank.
  auto gather = [&](const std::vector<at::Tensor>& parts) {
    const at::Tensor local = at::cat(parts).contiguous();
    at::Tensor all = at::empty({W * local.size(0), local.size(1)}, local.options());
    world.all_gather(all, local).wait();
    return all;
  };
  const at::Tensor images = gather(image_embeddings), texts = gather(text_embeddings);
  const at::Tensor similarity = images.matmul(texts.t());  // (N images, N texts)
  // A hit when the true partner scores at least as high as every other (identical captions tie exactly).
  const at::Tensor diagonal = similarity.diagonal();
  const double r1_i2t = (diagonal >= std::get<0>(similarity.max(1))).to(at::kDouble).mean().item<double>();
  const double r1_t2i = (diagonal >= std::get<0>(similarity.max(0))).to(at::kDouble).mean().item<double>();
  at::Tensor itm = at::tensor({static_cast<double>(itm_correct), static_cast<double>(itm_total)}, at::kDouble)
                       .to(images.device());  // NCCL reduces device tensors only
  world.all_reduce(itm, dist::ReduceOp::SUM).wait();
  itm = itm.cpu();
  return {{"r1_image_to_text", r1_i2t},
          {"r1_text_to_image", r1_t2i},
          {"itm_accuracy", itm[0].item<double>() / itm[1].item<double>()},
          {"eval_samples", static_cast<double>(used)}};
}

class FlavaPretraining : public Task {
 public:
  explicit FlavaPretraining(const FlavaConfig& config) : config_(config) {}
  std::string name() const override { return "pretraining"; }
  DataNeeds data_needs() const override {
    DataNeeds d;
    d.kinds = {true, true, true};
    d.mixes_kinds = true;
    d.image_size = config_.image_size, d.patch_size = config_.patch_size;
    d.codebook_size = 8 * config_.image_size / config_.patch_size;  // the codebook reads 8x8 pixels per token
    d.max_text_length = config_.max_positions, d.vocab_size = config_.vocab_size;
    d.uses_mlm = d.uses_mim = true;
    return d;
  }
  std::vector<std::string> loss_names() const override {
    return {"mim", "mlm", "itm", "contrastive", "mmm_image", "mmm_text"};
  }
  // ITM's negatives, in training and in evaluation, pair a text with another image of the same rank's batch: with
  // one sample per rank there are none, and ITM accuracy would count positives only.
  void check_batch_size(int64_t local_batch, int64_t world_size) const override {
    if (local_batch >= 2) return;
    std::string why = "FLAVA pretraining's ITM objective needs at least 2 samples per rank (its negatives pair a "
                      "text with another image of the same rank's batch)";
    if (local_batch * world_size < 2) why += ", and its contrastive loss at least 2 samples across all ranks";
    throw std::invalid_argument("train.batch_size: " + std::to_string(local_batch) + " per rank is too small: " +
                                why);
  }
  Losses compute_losses(torch::nn::Module& model, const data::Batch& b, uint64_t) const override {
    FlavaBatch fb;
    fb.input_ids = b.input_ids, fb.input_ids_masked = b.input_ids_masked, fb.attention_mask = b.attention_mask;
    fb.pixels = b.pixels, fb.codebook_pixels = b.codebook_pixels, fb.masked_patches = b.masked_patches;
    fb.mlm_labels = b.mlm_labels, fb.itm_labels = b.itm_labels;
    const FlavaOutputs o = module_as<FlavaImpl>(model, "flava").run(fb);
    Losses out;
    out.total = o.loss;
    const std::pair<const char*, const at::Tensor*> parts[] = {
        {"mim", &o.mim}, {"mlm", &o.mlm}, {"itm", &o.itm}, {"contrastive", &o.global_contrastive},
        {"mmm_image", &o.mmm_image}, {"mmm_text", &o.mmm_text}};
    for (const auto& [name, t] : parts) {
      if (t->defined()) out.parts[name] = value_of(*t);
    }
    return out;
  }
  // Each batch kind leaves some heads and poolers out of the loss.
  bool leaves_parameters_unused() const override { return true; }
  // The image-text step: the multimodal heads (MMM, ITM) and the projections take part, not the unimodal ones.
  std::vector<std::string> modules_without_gradient() const override {
    return {"text.pooler", "image.pooler", "multimodal.pooler", "mim_head", "mlm_head"};
  }

  bool has_evaluation() const override { return true; }
  data::SampleKind eval_kind() const override { return data::SampleKind::IMAGE_TEXT; }
  std::map<std::string, double> evaluate(torch::nn::Module& model, const EvalInputs& inputs) const override {
    return evaluate_flava(module_as<FlavaImpl>(model, "flava"), inputs);
  }
  std::string describe_progress(const std::map<std::string, double>& first,
                                const std::map<std::string, double>& last) const override {
    char out[200];
    std::snprintf(out, sizeof(out),
                  ", retrieval R@1 %.3f -> %.3f (chance %.3f), ITM accuracy %.3f -> %.3f (chance 0.5)",
                  first.at("r1_image_to_text"), last.at("r1_image_to_text"), 1.0 / last.at("eval_samples"),
                  first.at("itm_accuracy"), last.at("itm_accuracy"));
    return out;
  }

 private:
  FlavaConfig config_;
};

nlohmann::json flava_to_hf(const FlavaConfig& c);

class FlavaRecipe : public FamilyRecipe<FlavaConfig, Flava> {
 public:
  using FamilyRecipe::FamilyRecipe;
  std::string hf_config_json() const override { return flava_to_hf(config()).dump(2); }

  // Per sample, all encoders of width d with 4 d^2 + 2 d mlp_dim weights per layer (transformer_layer_flops), T
  // text tokens, n = (image_size / patch_size)^2 + 1 image tokens, U unimodal layers per encoder, M multimodal:
  //   text:       3 * U * layer(T)
  //   image:      3 * U * layer(n)
  //   image-text: 3 * (2 U (layer(T) + layer(n)) + M layer(n + T + 1))   (masked and unmasked passes of both
  //               encoders, then the multimodal encoder over both with its CLS)
  // The frozen codebook, embeddings and heads are left out (the usual 6N convention).
  double training_flops(const data::Batch& b) const override {
    const double d = static_cast<double>(config().dim), T = text_tokens(b);
    const double weights = 4 * d * d + 2 * d * static_cast<double>(config().mlp_dim);
    const double side = static_cast<double>(config().image_size / config().patch_size), n = side * side + 1;
    const double U = static_cast<double>(config().unimodal_layers), M = static_cast<double>(config().multimodal_layers);
    auto layer = [&](double tokens) { return transformer_layer_flops(weights, tokens, d); };
    double forward = 0;
    switch (b.kind) {
      case data::SampleKind::TEXT: forward = U * layer(T); break;
      case data::SampleKind::IMAGE: forward = U * layer(n); break;
      case data::SampleKind::IMAGE_TEXT: forward = 2 * U * (layer(T) + layer(n)) + M * layer(n + T + 1); break;
    }
    return 3 * forward * batch_rows(b);
  }

  std::vector<std::string> extra_unit_classes() const override { return {"FlavaImageCodebook"}; }

  void parallelize_hook(torch::nn::Module& root, const dist::DeviceMesh& mesh) const override {
    module_as<FlavaImpl>(root, "flava").set_contrastive_group(mesh.data_group());
  }

  // Megatron's split of every layer of the three encoders (models/tensor_parallel.h); the embeddings, the final norms
  // and poolers, the projections, the heads and the frozen codebook whole on every rank (small beside the layers;
  // the masked heads' logits whole). The contrastive loss gathers over the data-parallel ranks (parallelize_hook),
  // which a tensor-parallel group shares. No sequence parallelism: nothing splits the tokens.
  TpPlan tp_plan() const override {
    const FlavaConfig& c = config();
    TpPlan plan = {{"text.text_embeddings.**", TpStyle::WHOLE}, {"image.image_embeddings.**", TpStyle::WHOLE}};
    for (const char* encoder : {"text", "image", "multimodal"}) {
      const std::string e = encoder;
      plan.push_back({e, TpStyle::WHOLE});  // the multimodal encoder's CLS token
      plan.push_back({e + ".norm", TpStyle::WHOLE});
      plan.push_back({e + ".pooler", TpStyle::WHOLE});
      for (TpRule& rule : transformer_layer_tp_plan(e + ".layers.*", flava_layer_options(c))) {
        plan.push_back(std::move(rule));
      }
    }
    for (const char* whole : {"image_projection", "text_projection", "image_to_mm_projection", "text_to_mm_projection",
                              "itm_head_pooler", "itm_head", "mim_head.**", "mlm_head.**", "mmm_image_head.**",
                              "mmm_text_head.**", "image_codebook.**"}) {
      plan.push_back({whole, TpStyle::WHOLE});
    }
    return plan;
  }

  std::vector<std::string> tasks() const override { return {"pretraining"}; }

  // The image-text batch, the largest kind: T text tokens, n = P + 1 image tokens (P patches), n + T + 1 multimodal.
  //   inputs      the batch: pixels, the codebook's pixels, ids and masks (the patch convolution keeps the pixels,
  //               their cast copy under bf16/fp16)
  //   encoders    image and text run twice (unmasked for the contrastive loss, masked for the rest): their layers;
  //               per pass the final norm's input and statistics, the text embedding's sum and statistics; the
  //               unmasked passes' outputs (the projections read their CLS rows)
  //   multimodal  its layers, its final norm's input, statistics and output
  //   heads       MIM and MLM on the masked positions of the matching pairs only: each keeps four (K, d) tensors
  //               and log-softmax's (K, classes)
  // Before the encoders the frozen codebook turns the matching pairs' codebook pixels into MIM targets without
  // autograd: its first group holds about four (rows, hidden, 8 * side, 8 * side) tensors at once; on the CPU its
  // last group's convolutions two copies of their weight.
  ActivationBytes activation_bytes(const ActivationQuery& q) const override {
    const FlavaConfig& c = config();
    const int64_t e = element_size(q), d = c.dim, B = q.batch;
    const int64_t side = c.image_size / c.patch_size, P = side * side, n = P + 1;
    const int64_t T = q.seq_len > 0 ? q.seq_len : c.max_positions, m = n + T + 1;
    const int64_t U = c.unimodal_layers, M = c.multimodal_layers;
    const TransformerLayerOptions layer = flava_layer_options(c);
    const int64_t ui = B * n * d * e, ut = B * T * d * e, um = B * m * d * e;
    auto ln = [&](int64_t rows) { return norm_kept(Norm::kLayerNorm, rows, d, q); };
    const double positives = B * (1 - q.itm_negative_probability);
    const int64_t k_image = std::llround(positives * static_cast<double>(P) * q.mim_probability);
    const int64_t k_text = std::llround(positives * static_cast<double>(T) * q.mlm_probability);
    const LossBytes mim = cross_entropy_bytes(k_image, c.codebook.vocab_size, q);
    const LossBytes mlm = cross_entropy_bytes(k_text, c.vocab_size, q);
    auto head = [&](int64_t rows) { return 4 * rows * d * e + ln(rows); };
    const int64_t pixels = B * 3 * c.image_size * c.image_size, codebook_side = 8 * side;
    const int64_t inputs = pixels * 4 + (e == 4 ? 0 : pixels * e) + B * 3 * codebook_side * codebook_side * 4 +
                           B * P + 4 * B * T * 8;

    ActivationBytes a;
    // In forward order: the image encoder unmasked then masked, the text encoder likewise, the multimodal one.
    for (int pass = 0; pass < 4; ++pass) {
      add_transformer_layers(a, U, layer, B, pass < 2 ? n : T, 0, q);
      const bool masked = pass % 2 == 1;  // the same layers again
      for (size_t l = a.layers.size() - static_cast<size_t>(U); l < a.layers.size(); ++l) {
        (masked ? a.layers[l].ran_before : a.layers[l].runs_again) = true;
      }
    }
    add_transformer_layers(a, M, layer, B, m, 0, q);
    a.outside_layers = inputs + 2 * (ut + ln(B * T)) + 2 * (ui + ln(B * n)) + ui + 2 * (ut + ln(B * T)) + ut +
                       2 * um + ln(B * m) + head(k_image) + head(k_text) + mim.kept + mlm.kept;
    a.loss_kept = mim.kept + mlm.kept;
    const int64_t codebook_rows = std::max<int64_t>(1, std::llround(positives));
    // Late in the codebook, on the CPU, oneDNN's convolution holds two copies of a 3x3 weight while it runs (a
    // contiguous clone and its own reordered one; traced 2026-11-25): the last group's, 8h x 2h x 3 x 3, the
    // largest, outweighs the first group's activations at these few rows.
    const int64_t h = c.codebook.hidden_size, conv_copies = (q.device == parallel::Device::CUDA) ? 0 : 2 * (8 * h) * (2 * h) * 9 * e;
    a.start_transient = std::max(4 * codebook_rows * h * codebook_side * codebook_side * e, conv_copies);
    a.backward_transient = mim.backward_transient + mlm.backward_transient;
    return a;
  }

  // FlavaModel: the three encoders (each with its pooler), the four projections and the logit scale; no codebook,
  // no heads. transformers keeps no module of it whole (no _no_split_modules). Its text embeddings hold position
  // and token type ids as int64 buffers.
  HfModelLayout hf_base_model() const override {
    HfModelLayout out{"FlavaModel", hf_parameters(*Flava(config(), meta_build()), hf_names(), "flava."), {}};
    for (const char* ids : {"text_model.embeddings.position_ids", "text_model.embeddings.token_type_ids"}) {
      out.tensors.push_back({ids, {1, config().max_positions}, at::kLong, true});
    }
    return out;
  }

 protected:
  std::unique_ptr<Task> make_task(const std::string&) const override {
    return std::make_unique<FlavaPretraining>(config());
  }
};

// transformers' FlavaConfig of `c` (FlavaForPreTraining): one width, MLP size, head count and norm epsilon in
// all three encoder configs; the image config's vocab_size is the codebook's (the MIM classes).
nlohmann::json flava_to_hf(const FlavaConfig& c) {
  const nlohmann::json encoder = {{"hidden_size", c.dim},
                                  {"intermediate_size", c.mlp_dim},
                                  {"num_attention_heads", c.heads},
                                  {"layer_norm_eps", c.norm_eps},
                                  {"hidden_dropout_prob", c.dropout},
                                  {"attention_probs_dropout_prob", c.dropout},
                                  {"hidden_act", "gelu"},
                                  {"qkv_bias", true}};
  nlohmann::json text = encoder, image = encoder, mm = encoder;
  text.update({{"num_hidden_layers", c.unimodal_layers},
               {"vocab_size", c.vocab_size},
               {"max_position_embeddings", c.max_positions},
               {"type_vocab_size", c.type_vocab_size}});
  image.update({{"num_hidden_layers", c.unimodal_layers},
                {"image_size", c.image_size},
                {"patch_size", c.patch_size},
                {"num_channels", 3},
                {"vocab_size", c.codebook.vocab_size}});
  mm.update({{"num_hidden_layers", c.multimodal_layers}, {"use_cls_token", true}});
  const auto& w = c.weights;
  return {{"model_type", "flava"},
          {"architectures", {"FlavaForPreTraining"}},
          {"hidden_size", c.dim},
          {"projection_dim", c.dim},
          {"layer_norm_eps", c.norm_eps},
          {"logit_scale_init_value", c.logit_scale_init},
          {"mim_weight", w.mim},
          {"mlm_weight", w.mlm},
          {"itm_weight", w.itm},
          {"global_contrastive_weight", w.global_contrastive},
          {"mmm_image_weight", w.mmm_image},
          {"mmm_text_weight", w.mmm_text},
          {"text_config", text},
          {"image_config", image},
          {"multimodal_config", mm},
          {"image_codebook_config",
           {{"hidden_size", c.codebook.hidden_size},
            {"num_blocks_per_group", c.codebook.blocks_per_group},
            {"vocab_size", c.codebook.vocab_size},
            {"input_channels", c.codebook.channels},
            {"num_groups", 4}}}};
}

// FlavaConfig's keys and its four sub-configs. shardtrain's FLAVA has one width, MLP size and head count for all
// three encoders and the projections, and as many text as image layers: sub-configs that differ are refused,
// naming the key.
FlavaConfig flava_from_hf(const HfConfig& hf) {
  FlavaConfig c;
  const HfConfig text = hf.section("text_config"), image = hf.section("image_config");
  const HfConfig mm = hf.section("multimodal_config"), codebook = hf.section("image_codebook_config");
  c.dim = hf.integer("hidden_size", c.dim);
  c.mlp_dim = text.integer("intermediate_size", c.mlp_dim);
  c.heads = text.integer("num_attention_heads", c.heads);
  c.unimodal_layers = text.integer("num_hidden_layers", c.unimodal_layers);
  c.multimodal_layers = mm.integer("num_hidden_layers", c.multimodal_layers);
  c.vocab_size = text.integer("vocab_size", c.vocab_size);
  c.max_positions = text.integer("max_position_embeddings", c.max_positions);
  c.type_vocab_size = text.integer("type_vocab_size", c.type_vocab_size);
  c.image_size = image.integer("image_size", c.image_size);
  c.patch_size = image.integer("patch_size", c.patch_size);
  c.norm_eps = hf.number("layer_norm_eps", c.norm_eps);
  c.dropout = text.number("hidden_dropout_prob", c.dropout);
  c.logit_scale_init = hf.number("logit_scale_init_value", c.logit_scale_init);
  c.codebook.hidden_size = codebook.integer("hidden_size", c.codebook.hidden_size);
  c.codebook.blocks_per_group = codebook.integer("num_blocks_per_group", c.codebook.blocks_per_group);
  c.codebook.vocab_size = codebook.integer("vocab_size", c.codebook.vocab_size);
  c.codebook.channels = codebook.integer("input_channels", c.codebook.channels);
  image.require("vocab_size", {std::to_string(c.codebook.vocab_size)}, "FLAVA (MIM classes = codebook tokens)");
  codebook.require("num_groups", {"4"}, "FLAVA's codebook");
  auto& w = c.weights;
  w.mim = hf.number("mim_weight", w.mim), w.mlm = hf.number("mlm_weight", w.mlm);
  w.itm = hf.number("itm_weight", w.itm), w.global_contrastive = hf.number("global_contrastive_weight", w.global_contrastive);
  w.mmm_image = hf.number("mmm_image_weight", w.mmm_image), w.mmm_text = hf.number("mmm_text_weight", w.mmm_text);
  const std::string one = "FLAVA (one width for every encoder and projection)";
  hf.require("projection_dim", {std::to_string(c.dim)}, one);
  for (const HfConfig* sub : {&text, &image, &mm}) {
    sub->require("hidden_size", {std::to_string(c.dim)}, one);
    sub->require("intermediate_size", {std::to_string(c.mlp_dim)}, "FLAVA (one MLP size for every encoder)");
    sub->require("num_attention_heads", {std::to_string(c.heads)}, "FLAVA (one head count for every encoder)");
    sub->require("hidden_act", {"gelu"}, "FLAVA");
  }
  image.require("num_hidden_layers", {std::to_string(c.unimodal_layers)}, "FLAVA (as many image as text layers)");
  image.require("num_channels", {"3"}, "FLAVA");
  image.require("qkv_bias", {"true"}, "FLAVA");
  mm.require("use_cls_token", {"true"}, "FLAVA");
  return c;
}

}  // namespace

ModelFamily flava_family() {
  return {"flava", flava_flavors,
          [](const std::string& f) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<FlavaRecipe>("flava", f, flava_flavor(f), flava_names, "FlavaLayer");
          },
          "flava",
          [](const HfConfig& hf, const std::string& name) -> std::shared_ptr<const ModelRecipe> {
            return std::make_shared<FlavaRecipe>("flava", name, flava_from_hf(hf), flava_names, "FlavaLayer");
          },
          {{"dim",
            {"hidden_size", "projection_dim", "text_config.hidden_size", "image_config.hidden_size",
             "multimodal_config.hidden_size"}},
           {"mlp_dim",
            {"text_config.intermediate_size", "image_config.intermediate_size", "multimodal_config.intermediate_size"}},
           {"heads",
            {"text_config.num_attention_heads", "image_config.num_attention_heads",
             "multimodal_config.num_attention_heads"}},
           {"unimodal_layers", {"text_config.num_hidden_layers", "image_config.num_hidden_layers"}},
           {"multimodal_layers", {"multimodal_config.num_hidden_layers"}},
           {"image_size", {"image_config.image_size"}},
           {"patch_size", {"image_config.patch_size"}},
           {"vocab_size", {"text_config.vocab_size"}},
           {"max_positions", {"text_config.max_position_embeddings"}},
           {"codebook_vocab_size", {"image_codebook_config.vocab_size", "image_config.vocab_size"}},
           {"norm_eps",
            {"layer_norm_eps", "text_config.layer_norm_eps", "image_config.layer_norm_eps",
             "multimodal_config.layer_norm_eps"}}}};
}

}  // namespace shardtrain::models
