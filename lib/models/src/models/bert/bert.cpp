#include "shardtrain/models/bert.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "models/layer_names.h"
#include "models/unknown_flavor.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"

namespace shardtrain::models {

std::vector<std::string> bert_flavors() {
  return {"bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-debug"};
}

BertConfig bert_flavor(const std::string& name) {
  BertConfig c;  // bert-base-uncased
  if (name == "bert-base-uncased") return c;
  if (name == "bert-base-cased") {
    c.vocab_size = 28996;
    return c;
  }
  if (name == "bert-large-uncased") {
    c.dim = 1024, c.layers = 24, c.heads = 16, c.mlp_dim = 4096;
    return c;
  }
  if (name == "bert-debug") {
    c.vocab_size = 1000, c.max_positions = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.mlp_dim = 64;
    c.mlm_head = true;
    return c;
  }
  throw_unknown_flavor("BERT", name, bert_flavors());
}

TransformerLayerOptions bert_layer_options(const BertConfig& c) {
  TransformerLayerOptions l;
  l.class_name = "BertLayer";
  l.attention.dim = c.dim, l.attention.heads = c.heads, l.attention.dropout = c.dropout;
  l.mlp_dim = c.mlp_dim, l.activation = Activation::kGelu, l.norm_eps = c.norm_eps, l.norm_first = false;
  l.dropout = c.dropout;
  return l;
}

BertImpl::BertImpl(const BertConfig& c, const BuildOptions& build) : Interceptable("Bert"), config(c) {
  const auto& t = build.tensors;
  TextEmbeddingOptions e;
  e.vocab_size = c.vocab_size, e.max_positions = c.max_positions, e.type_vocab_size = c.type_vocab_size;
  e.dim = c.dim, e.norm_eps = c.norm_eps, e.dropout = c.dropout;
  embeddings = register_module("embeddings", TextEmbeddings(e, t));
  std::vector<std::string> built;
  layers = build_layers(*this, "layers", "layers", c.layers, bert_layer_options(c), build, built);
  if (c.pooler) pooler = register_module("pooler", Linear(c.dim, c.dim, true, t));
  if (!c.labels.empty() && (c.mlm_head || (!c.pooler && !c.token_classifier))) {
    throw std::invalid_argument("BERT: a sequence classifier needs the pooler and no masked-LM head");
  }
  if (c.token_classifier && c.labels.empty()) throw std::invalid_argument("BERT: a token classifier without classes");
  if (!c.labels.empty()) {
    classifier = register_module("classifier", Linear(c.dim, static_cast<int64_t>(c.labels.size()), true, t));
  }
  if (c.mlm_head) {
    mlm_transform = register_module("mlm_transform", Linear(c.dim, c.dim, true, t));
    mlm_norm = register_module("mlm_norm", LayerNorm(c.dim, c.norm_eps, t));
    mlm_bias = register_parameter("mlm_bias", at::empty({c.vocab_size}, t));
  }
  finish_model(build, *this, built);
}

BertOutputs BertImpl::run(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                          const at::Tensor& token_type_ids, const at::Tensor& labels, bool labelled_only) {
  return from_tensors<BertOutputs>(forward(input_ids, attention_mask, token_type_ids, labels, labelled_only));
}

std::vector<at::Tensor> BertImpl::forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                               const at::Tensor& token_type_ids, const at::Tensor& labels,
                                               bool labelled_only) {
  // The MLM decoder is the word table: the lookup's rows are added into the decoder's dense gradient (tie_table()).
  const TiedTable word = mlm_transform ? tie_table(embeddings->word->weight) : TiedTable{};
  at::Tensor x = embeddings->forward(input_ids, token_type_ids, mlm_transform ? word.lookups[0] : at::Tensor());
  const at::Tensor bias = padding_bias_if_padded(attention_mask, attention_dtype(x));
  x = run_layers(layers, x, bias);
  BertOutputs out;
  at::Tensor &pooled = out.pooled, &logits = out.logits, &loss = out.loss;
  if (pooler) pooled = at::tanh(pooler->forward(x.select(1, 0)));
  if (mlm_transform) {
    auto head = [&](const at::Tensor& h) {
      return tied_projection(mlm_norm->forward(at::gelu(mlm_transform->forward(h))), word.head, mlm_bias);
    };
    if (labelled_only && labels.defined()) {
      const LabelledRows labelled = labelled_rows(x, labels);
      logits = head(labelled.hidden);
      loss = masked_cross_entropy(logits, labelled.labels);
    } else {
      logits = head(x);
      if (labels.defined()) loss = masked_cross_entropy(logits, labels);
    }
  } else if (classifier && config.token_classifier) {
    logits = classifier->forward(at::dropout(x, config.classifier_dropout, is_training()));
    if (labels.defined()) loss = masked_cross_entropy(logits, labels);
  } else if (classifier) {
    logits = classifier->forward(at::dropout(pooled, config.classifier_dropout, is_training()));
    if (labels.defined()) loss = classifier_loss(logits, labels);
  } else if (labels.defined()) {
    throw std::invalid_argument("BERT: labels given to a model built without a head (no MLM head, no classifier)");
  }
  out.hidden = x;
  return as_tensors(out);
}

NameMap bert_names() {
  NameRules rules = {
      prefix_rule("embeddings.word", "bert.embeddings.word_embeddings"),
      prefix_rule("embeddings.position", "bert.embeddings.position_embeddings"),
      prefix_rule("embeddings.token_type", "bert.embeddings.token_type_embeddings"),
      prefix_rule("embeddings.norm", "bert.embeddings.LayerNorm"),
      prefix_rule("pooler", "bert.pooler.dense"),
      prefix_rule("mlm_transform", "cls.predictions.transform.dense"),
      prefix_rule("mlm_norm", "cls.predictions.transform.LayerNorm"),
      {"^mlm_bias$", "cls.predictions.bias"},
  };
  append(rules, layer_rules("layers", "bert.encoder.layer",
                            {{"attn.q", "attention.self.query"},
                             {"attn.k", "attention.self.key"},
                             {"attn.v", "attention.self.value"},
                             {"attn.o", "attention.output.dense"},
                             {"norm1", "attention.output.LayerNorm"},
                             {"mlp.fc1", "intermediate.dense"},
                             {"mlp.fc2", "output.dense"},
                             {"norm2", "output.LayerNorm"}}));
  // The decoder is tied to the word embeddings; position ids are a buffer. Heads (fine-tuning moves between them,
  // weights.h): the masked-LM head, the classifier, the pooler (transformers' BertForMaskedLM has none, the
  // classifier reads it), and the next-sentence head of BertForPreTraining (never built).
  return NameMap(rules,
                 {"^cls\\.predictions\\.decoder\\..*$", "^(bert\\.)?embeddings\\.position_ids$",
                  "^(bert\\.)?embeddings\\.token_type_ids$"},
                 {}, {"^cls\\..*$", "^classifier\\..*$", "^(bert\\.)?pooler\\..*$"});
}


}  // namespace shardtrain::models
