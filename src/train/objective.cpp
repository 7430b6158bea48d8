#include "train/objective.h"

#include <ATen/ATen.h>

#include <random>
#include <stdexcept>

#include "shardtrain/models/bert.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"

namespace shardtrain::train {
namespace {

double value_of(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

// T5's span corruption of one row of token ids (no specials): about noise * n tokens in spans of mean length
// `mean_span` are each replaced by one sentinel in the input; the target lists each sentinel followed by the
// span it hides, then EOS. Sentinels count down from `first_sentinel`.
std::pair<std::vector<int64_t>, std::vector<int64_t>> span_corrupt(const std::vector<int64_t>& tokens,
                                                                    int64_t first_sentinel, int64_t eos,
                                                                    std::mt19937_64& rng) {
  constexpr double kNoise = 0.15, kMeanSpan = 3.0;
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<uint8_t> noise(static_cast<size_t>(n), 0);
  const int64_t masked = std::max<int64_t>(n > 1 ? 1 : 0, std::llround(kNoise * static_cast<double>(n)));
  const int64_t spans = std::max<int64_t>(masked > 0 ? 1 : 0, std::llround(static_cast<double>(masked) / kMeanSpan));
  for (int64_t s = 0, placed = 0; s < spans && placed < masked; ++s) {
    const int64_t length = std::min<int64_t>(masked - placed, std::max<int64_t>(1, masked / spans));
    const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(1, n - length + 1)));
    for (int64_t i = start; i < start + length; ++i) placed += noise[static_cast<size_t>(i)] ? 0 : 1, noise[static_cast<size_t>(i)] = 1;
  }
  std::vector<int64_t> input, target;
  int64_t sentinel = first_sentinel;
  for (int64_t i = 0; i < n; ++i) {
    if (!noise[static_cast<size_t>(i)]) {
      input.push_back(tokens[static_cast<size_t>(i)]);
      continue;
    }
    if (i == 0 || !noise[static_cast<size_t>(i - 1)]) {
      input.push_back(sentinel);
      target.push_back(sentinel);
      --sentinel;
    }
    target.push_back(tokens[static_cast<size_t>(i)]);
  }
  input.push_back(eos);
  target.push_back(eos);
  return {input, target};
}

at::Tensor padded(const std::vector<std::vector<int64_t>>& rows, int64_t pad) {
  size_t width = 1;
  for (const auto& r : rows) width = std::max(width, r.size());
  auto out = at::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, pad, at::kLong);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < rows[i].size(); ++j) out[static_cast<int64_t>(i)][static_cast<int64_t>(j)] = rows[i][j];
  }
  return out;
}

// Per-layer forward FLOPs for L tokens of width d with `weights` multiply-adds per token.
double layer_flops(double weights, double tokens, double dim) { return 2 * weights * tokens + 4 * tokens * tokens * dim; }

}  // namespace

const std::vector<std::string>& loss_names() {
  static const std::vector<std::string> names = {"mim", "mlm", "itm", "contrastive", "mmm_image",
                                                 "mmm_text", "cls", "lm", "span"};
  return names;
}

ModelShape model_shape(const std::string& family, const std::string& flavor) {
  ModelShape s;
  if (family == "flava") {
    const auto c = models::flava_flavor(flavor);
    s.image_size = c.image_size, s.patch_size = c.patch_size, s.codebook_size = 8 * c.image_size / c.patch_size;
    s.max_text_length = c.max_positions, s.vocab_size = c.vocab_size;
    s.uses_mlm = s.uses_mim = true;
    s.kinds = {true, true, true};
  } else if (family == "bert") {
    const auto c = models::bert_flavor(flavor);
    if (!c.mlm_head) {
      throw std::invalid_argument(flavor + " is a BertModel without a masked-LM head; train bert-debug or add one");
    }
    s.max_text_length = c.max_positions, s.vocab_size = c.vocab_size, s.uses_mlm = true;
    s.kinds = {false, true, false};
  } else if (family == "vit") {
    const auto c = models::vit_flavor(flavor);
    if (c.num_labels <= 0) throw std::invalid_argument(flavor + " has no classifier to train");
    s.image_size = c.image_size, s.patch_size = c.patch_size, s.num_labels = c.num_labels;
    s.kinds = {false, false, true};
  } else if (family == "t5") {
    const auto c = models::t5_flavor(flavor);
    s.max_text_length = 512, s.vocab_size = c.vocab_size;
    s.kinds = {false, true, false};
  } else if (family == "llama") {
    const auto c = models::llama_flavor(flavor);
    s.max_text_length = c.max_positions, s.vocab_size = c.vocab_size;
    s.kinds = {false, true, false};
  } else {
    throw std::invalid_argument("no training objective for family '" + family + "'");
  }
  return s;
}

Losses compute_losses(models::ZooModel& model, const data::Batch& b, uint64_t seed) {
  Losses out;
  auto* module = model.module.get();
  if (auto* flava = dynamic_cast<models::FlavaImpl*>(module)) {
    models::FlavaBatch fb;
    fb.input_ids = b.input_ids, fb.input_ids_masked = b.input_ids_masked, fb.attention_mask = b.attention_mask;
    fb.pixels = b.pixels, fb.codebook_pixels = b.codebook_pixels, fb.masked_patches = b.masked_patches;
    fb.mlm_labels = b.mlm_labels, fb.itm_labels = b.itm_labels;
    const models::FlavaOutputs o = flava->run(fb);
    out.total = o.loss;
    const std::pair<const char*, const at::Tensor*> parts[] = {
        {"mim", &o.mim}, {"mlm", &o.mlm}, {"itm", &o.itm}, {"contrastive", &o.global_contrastive},
        {"mmm_image", &o.mmm_image}, {"mmm_text", &o.mmm_text}};
    for (const auto& [name, t] : parts) {
      if (t->defined()) out.parts[name] = value_of(*t);
    }
  } else if (auto* bert = dynamic_cast<models::BertImpl*>(module)) {
    out.total = bert->run(b.input_ids_masked, b.attention_mask, {}, b.mlm_labels).loss;
    out.parts["mlm"] = value_of(out.total);
  } else if (auto* vit = dynamic_cast<models::VitImpl*>(module)) {
    if (!b.labels.defined()) throw std::runtime_error("ViT classification needs a .cls label in every image sample");
    const int64_t classes = vit->config.num_labels, top = b.labels.max().item<int64_t>();
    if (top >= classes || b.labels.min().item<int64_t>() < 0) {
      throw std::runtime_error("label " + std::to_string(top) + " is outside " + model.flavor + "'s " +
                               std::to_string(classes) + " classes");
    }
    out.total = vit->run(b.pixels, b.labels).loss;
    out.parts["cls"] = value_of(out.total);
  } else if (auto* llama = dynamic_cast<models::LlamaImpl*>(module)) {
    const at::Tensor labels = b.input_ids.masked_fill(b.attention_mask == 0, models::kIgnoreIndex);
    out.total = llama->run(b.input_ids, b.attention_mask, labels).loss;
    out.parts["lm"] = value_of(out.total);
  } else if (auto* t5 = dynamic_cast<models::T5Impl*>(module)) {
    // The text's tokens without [CLS]/[SEP]/[PAD]; [SEP] doubles as EOS.
    const int64_t rows = b.input_ids.size(0), vocab = t5->config.vocab_size;
    std::vector<std::vector<int64_t>> inputs, targets;
    std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(b.step) * 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(b.micro));
    for (int64_t r = 0; r < rows; ++r) {
      const at::Tensor ids = b.input_ids[r].masked_select(b.attention_mask[r] != 0);
      std::vector<int64_t> tokens(ids.data_ptr<int64_t>() + 1, ids.data_ptr<int64_t>() + ids.numel() - 1);
      const int64_t eos = ids[ids.numel() - 1].item<int64_t>();
      auto [input, target] = span_corrupt(tokens, vocab - 1, eos, rng);
      inputs.push_back(std::move(input));
      targets.push_back(std::move(target));
    }
    const at::Tensor input_ids = padded(inputs, t5->config.pad_token_id);
    const at::Tensor mask = (input_ids != t5->config.pad_token_id).to(at::kLong);
    const at::Tensor labels = padded(targets, models::kIgnoreIndex);
    out.total = t5->run(input_ids, mask, {}, labels).loss;
    out.parts["span"] = value_of(out.total);
  } else {
    throw std::invalid_argument("no training objective for " + model.flavor);
  }
  return out;
}

double training_flops(const std::string& family, const std::string& flavor, const data::Batch& b) {
  const double B = static_cast<double>((b.input_ids.defined() ? b.input_ids : b.pixels).size(0));
  const double T = b.input_ids.defined() ? static_cast<double>(b.input_ids.size(1)) : 0;
  double forward = 0;  // per sample
  if (family == "flava") {
    const auto c = models::flava_flavor(flavor);
    const double d = static_cast<double>(c.dim), weights = 4 * d * d + 2 * d * static_cast<double>(c.mlp_dim);
    const double n = std::pow(static_cast<double>(c.image_size / c.patch_size), 2) + 1;
    const double uni = static_cast<double>(c.unimodal_layers), mm = static_cast<double>(c.multimodal_layers);
    switch (b.kind) {
      case data::SampleKind::TEXT: forward = uni * layer_flops(weights, T, d); break;
      case data::SampleKind::IMAGE: forward = uni * layer_flops(weights, n, d); break;
      case data::SampleKind::IMAGE_TEXT:  // masked and unmasked passes of both encoders, then the multimodal one
        forward = 2 * uni * (layer_flops(weights, T, d) + layer_flops(weights, n, d)) +
                  mm * layer_flops(weights, n + T + 1, d);
        break;
    }
  } else if (family == "bert") {
    const auto c = models::bert_flavor(flavor);
    const double d = static_cast<double>(c.dim);
    forward = static_cast<double>(c.layers) * layer_flops(4 * d * d + 2 * d * static_cast<double>(c.mlp_dim), T, d);
  } else if (family == "vit") {
    const auto c = models::vit_flavor(flavor);
    const double d = static_cast<double>(c.dim), n = std::pow(static_cast<double>(c.image_size / c.patch_size), 2) + 1;
    forward = static_cast<double>(c.layers) * layer_flops(4 * d * d + 2 * d * static_cast<double>(c.mlp_dim), n, d);
  } else if (family == "llama") {
    const auto c = models::llama_flavor(flavor);
    const double d = static_cast<double>(c.dim), kv = d * static_cast<double>(c.kv_heads) / static_cast<double>(c.heads);
    forward = static_cast<double>(c.layers) *
              layer_flops(2 * d * d + 2 * d * kv + 3 * d * static_cast<double>(c.mlp_dim), T, d);
  } else if (family == "t5") {
    const auto c = models::t5_flavor(flavor);
    const double d = static_cast<double>(c.dim), inner = static_cast<double>(c.heads * c.head_dim);
    const double attn = 4 * d * inner, mlp = 2 * d * static_cast<double>(c.mlp_dim);
    forward = static_cast<double>(c.layers) * (layer_flops(attn + mlp, T, inner) + layer_flops(2 * attn + mlp, T / 2, inner));
  }
  return 3 * forward * B;
}

}  // namespace shardtrain::train
