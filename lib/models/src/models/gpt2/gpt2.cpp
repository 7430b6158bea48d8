#include "shardtrain/models/gpt2.h"

#include <ATen/ATen.h>

#include <optional>
#include <stdexcept>

#include "models/layer_names.h"
#include "models/causal_lm.h"
#include "models/unknown_flavor.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"
#include "shardtrain/tp/regions.h"
#include "shardtrain/tp/rng_fork.h"

namespace shardtrain::models {

std::vector<std::string> gpt2_flavors() {
  return {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", "gpt2-debug"};
}

Gpt2Config gpt2_flavor(const std::string& name) {
  Gpt2Config c;  // gpt2
  auto size = [&c](int64_t dim, int64_t layers, int64_t heads) {
    c.dim = dim, c.layers = layers, c.heads = heads, c.mlp_dim = 4 * dim;
    return c;
  };
  if (name == "gpt2") return c;
  if (name == "gpt2-medium") return size(1024, 24, 16);
  if (name == "gpt2-large") return size(1280, 36, 20);
  if (name == "gpt2-xl") return size(1600, 48, 25);
  if (name == "distilgpt2") return size(768, 6, 12);
  if (name == "gpt2-debug") {
    c.vocab_size = 1000, c.max_positions = 128;
    return size(64, 2, 4);
  }
  throw_unknown_flavor("GPT-2", name, gpt2_flavors());
}

TransformerLayerOptions gpt2_layer_options(const Gpt2Config& c) {
  TransformerLayerOptions l;
  l.class_name = "GPT2Block";
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.causal = true;
  l.attention.fused_qkv = true, l.attention.transposed = true, l.attention.dropout = c.attn_dropout;
  l.mlp_dim = c.mlp_dim, l.activation = c.activation;
  l.norm = Norm::kLayerNorm, l.norm_eps = c.norm_eps, l.dropout = c.resid_dropout;
  return l;
}

Gpt2Impl::Gpt2Impl(const Gpt2Config& c, const BuildOptions& build) : Interceptable("GPT2"), config(c) {
  const auto& t = build.tensors;
  embed = register_module("embed", Embedding(c.vocab_size, c.dim, t));
  pos_embed = register_module("pos_embed", Embedding(c.max_positions, c.dim, t));
  std::vector<std::string> built;
  layers = build_layers(*this, "layers", "layers", c.layers, gpt2_layer_options(c), build, built);
  norm = register_module("norm", LayerNorm(c.dim, c.norm_eps, t));
  if (c.classifier.enabled()) {
    score = register_module("score", Linear(c.dim, c.classifier.classes(), /*bias=*/false, t));
  }
  finish_model(build, *this, built);
}

Gpt2Outputs Gpt2Impl::run(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& labels,
                          bool labelled_only, const at::Tensor& position_ids) {
  return from_tensors<CausalLmOutputs>(forward(input_ids, attention_mask, labels, labelled_only, position_ids));
}

std::vector<at::Tensor> Gpt2Impl::forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                               const at::Tensor& labels, bool labelled_only,
                                               const at::Tensor& position_ids) {
  const int64_t length = input_ids.size(1);
  const bool decoding = position_ids.defined();
  const int64_t positions = decoding && attention_mask.defined() ? attention_mask.size(1) : length;
  if (positions > config.max_positions) {
    throw std::invalid_argument("GPT-2: " + std::to_string(positions) + " tokens exceed its " +
                                std::to_string(config.max_positions) + " positions (n_positions)");
  }
  // The lookups' rows go into the head's dense gradient, one vocab x dim gradient, not two (a classifier's table is
  // a lookup's alone); split by tensor parallelism, under sequence parallelism each rank adds its positions' slice.
  const bool tied = !config.classifier.enabled();
  const TokenTable table(*embed, tied);
  const at::Tensor position = decoding ? position_ids : at::arange(length, input_ids.options().dtype(at::kLong));
  at::Tensor positions_added = pos_embed->forward(position);  // (T, C), or (B, T, C) decoding
  if (table.sequence_parallel()) {
    positions_added = tp::split_along(positions_added, positions_added.dim() - 2, table.shard()->group);
  }
  at::Tensor x = table.lookup(input_ids) + positions_added;  // (B, T, C), or (B, T / t, C) sequence parallel
  if (is_training() && config.embd_dropout > 0) {
    std::optional<tp::RngFork> fork;  // sequence parallel: this rank's slice of the tokens, its own mask
    if (table.sequence_parallel()) fork.emplace(x.device(), table.shard()->group.rank());
    x = at::dropout(x, config.embd_dropout, true);
  }
  if (!tied) {
    if (decoding) throw std::invalid_argument("GPT-2: a sequence classifier does not decode");
    const CausalLmStart start = causal_classifier_start(attention_mask, length, 0, attention_dtype(x), x.device());
    const at::Tensor logits = score->forward(last_token_rows(norm->forward(run_layers(layers, x, start.bias)),
                                                             attention_mask));
    return as_tensors(CausalLmOutputs{logits, labels.defined() ? classifier_loss(logits, labels) : at::Tensor()});
  }
  auto head = [&](const at::Tensor& h, const at::Tensor& targets) { return table.head(h, targets); };
  if (decoding) {
    const at::Tensor h = norm->forward(
        run_layers(layers, x, causal_lm_decode_bias(input_ids, attention_mask, 0, attention_dtype(x))));
    return as_tensors(CausalLmOutputs{head(h.narrow(1, length - 1, 1), {}), at::Tensor()});
  }
  const CausalLmStart start =
      causal_lm_start(attention_mask, labels, labelled_only, length, 0, attention_dtype(x), x.device());
  return as_tensors(causal_lm_outputs(norm->forward(run_layers(layers, x, start.bias)), start, labels, head));
}

NameMap gpt2_names() {
  NameRules rules = {prefix_rule("embed", "transformer.wte"), prefix_rule("pos_embed", "transformer.wpe"),
                     prefix_rule("norm", "transformer.ln_f")};
  append(rules, layer_rules("layers", "transformer.h",
                            {{"attn.qkv", "attn.c_attn"},
                             {"attn.o", "attn.c_proj"},
                             {"norm1", "ln_1"},
                             {"norm2", "ln_2"},
                             {"mlp.fc1", "mlp.c_fc"},
                             {"mlp.fc2", "mlp.c_proj"}}));
  // The head is the token table (a file may keep the copy); older files keep each layer's causal mask (attn.bias,
  // attn.masked_bias), which the model makes itself.
  const std::vector<std::string> ignored = {"^lm_head\\.weight$",
                                            "^(transformer\\.)?h\\.\\d+\\.attn\\.(bias|masked_bias)$"};
  const std::vector<std::string> conv1d = {
      "^(transformer\\.)?h\\.\\d+\\.(attn\\.c_attn|attn\\.c_proj|mlp\\.c_fc|mlp\\.c_proj)\\.weight$"};
  // A GPT2LMHeadModel's file has no score: a classifier fine-tuned from it starts with score initialized (reported).
  return NameMap(rules, ignored, {}, {"^score\\.weight$"}, conv1d);
}

}  // namespace shardtrain::models
