// BERT (Devlin et al.), as Hugging Face's BertModel / BertForMaskedLM / BertForSequenceClassification /
// BertForTokenClassification: post-norm encoder, optional pooler, and either the masked-language-modelling head (its
// decoder tied to the word embeddings), a sequence classifier on the pooled output or a classifier of every token.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/embeddings.h"
#include "shardtrain/models/weights.h"

namespace shardtrain::models {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t max_positions = 512;
  int64_t type_vocab_size = 2;
  int64_t dim = 768;
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t mlp_dim = 3072;
  double norm_eps = 1e-12;
  double dropout = 0.1;
  bool pooler = true;
  bool mlm_head = false;
  // The classes of a sequence classifier (its outputs, by id; transformers' id2label), empty: none. Needs the pooler
  // and excludes the MLM head. One name: a regression (num_labels 1, as transformers: one output, mean squared
  // error against float scores).
  std::vector<std::string> labels;
  // Each sample has a set of the classes, each output a yes/no: binary cross-entropy on every output (transformers'
  // problem_type multi_label_classification); labels (B, classes) float 0/1.
  bool multi_label = false;
  double classifier_dropout = 0.1;  // before the classifier (transformers: classifier_dropout, else hidden_dropout)
  // The classifier classifies every token (transformers' BertForTokenClassification, named entities): logits (B, T,
  // classes) on the last layer's output, no pooler needed; labels (B, T) class ids, -100 where no loss is taken.
  bool token_classifier = false;
};

// bert-base-uncased, bert-base-cased, bert-large-uncased (the published configurations), bert-debug.
std::vector<std::string> bert_flavors();
BertConfig bert_flavor(const std::string& name);  // throws std::invalid_argument listing the flavors
TransformerLayerOptions bert_layer_options(const BertConfig& config);  // its BertLayer (post-norm, GELU)

struct BertOutputs {
  at::Tensor hidden;  // (B, T, C)
  at::Tensor pooled;  // (B, C): tanh(pooler(hidden[:, 0])), when the model has a pooler
  at::Tensor logits;  // (B, T, vocab) with the MLM head ((K, vocab) when run labelled_only); (B, classes) with the
                      // classifier, (B, T, classes) with a token classifier
  at::Tensor loss;    // () mean cross-entropy over labels (!= -100 for the MLM head), when labels are given; a
                      // regression's mean squared error
  static auto fields() {  // forward_impl's tensors, in order (named_outputs.h)
    return std::make_tuple(&BertOutputs::hidden, &BertOutputs::pooled, &BertOutputs::logits, &BertOutputs::loss);
  }
};

// Children: embeddings, layers.N (class "BertLayer"), pooler, mlm_transform, mlm_norm or classifier; parameter
// mlm_bias.
class BertImpl : public nn::Interceptable<BertImpl, std::vector<at::Tensor>(at::Tensor, at::Tensor, at::Tensor,
                                                                             at::Tensor, bool)> {
 public:
  BertImpl(const BertConfig& config, const BuildOptions& build = {});
  // input_ids (B, T) int64; attention_mask (B, T) 1 = token, 0 = padding (undefined: all tokens); token_type_ids
  // (B, T) or undefined; labels int64 or undefined: (B, T) with -100 where no loss is taken for the MLM head, (B)
  // class ids for the classifier, (B) float scores for a regression's, (B, classes) float 0/1 for a multi-label one,
  // (B, T) class ids or -100 for a token classifier. labelled_only (with MLM labels): the MLM
  // head runs at the K labelled positions only (row-major order), all the loss reads — the same loss and gradients
  // without the (B, T, vocab) logits, at a sixth of the head's work at 15% masking.
  BertOutputs run(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                  const at::Tensor& token_type_ids = {}, const at::Tensor& labels = {}, bool labelled_only = false);
  // {hidden, pooled, logits, loss}; see run().
  std::vector<at::Tensor> forward_impl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                       const at::Tensor& token_type_ids, const at::Tensor& labels,
                                       bool labelled_only);

  BertConfig config;
  TextEmbeddings embeddings{nullptr};
  std::vector<TransformerLayer> layers;
  Linear pooler{nullptr}, mlm_transform{nullptr}, classifier{nullptr};
  LayerNorm mlm_norm{nullptr};
  at::Tensor mlm_bias;
};
TORCH_MODULE(Bert);

// Hugging Face names: "bert.encoder.layer.N.attention.self.query.weight", "cls.predictions.transform.dense.weight"...
NameMap bert_names();

}  // namespace shardtrain::models
