// The model zoo without references: every debug flavor runs forward and backward with finite losses of the right
// shapes, weights depend only on the seed and names, and safetensors files round-trip and are validated with
// errors that name the offending tensor.
#include <gtest/gtest.h>

#include <algorithm>

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "shardtrain/io/files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/bert.h"
#include "shardtrain/models/blocks.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/named_outputs.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/safetensors_files.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"
#include "shardtrain/models/zoo.h"
#include "models/activation_model.h"
#include "nn/autocast_guard.h"
#include "support/expect_error.h"
#include "support/scratch.h"

namespace shardtrain::models {
namespace {

using shardtrain::testing::expect_error;
using shardtrain::testing::TempDir;

void expect_trainable(const at::Tensor& loss, torch::nn::Module& model) {
  ASSERT_TRUE(loss.defined());
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  int64_t with_grad = 0;
  for (const auto& p : model.parameters()) with_grad += p.grad().defined() ? 1 : 0;
  EXPECT_GT(with_grad, 0);
}

// A model's forward hands its named outputs through the interceptors as tensors, in the order its struct lists
// them, and back; a forward out of step with its struct is a clear error, not a shifted field.
TEST(Models, NamedOutputsGoThroughForwardAsTensorsAndBack) {
  BertOutputs out;
  out.hidden = at::ones({2}), out.logits = at::full({3}, 2.0), out.loss = at::full({}, 5.0);
  const std::vector<at::Tensor> tensors = as_tensors(out);
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_TRUE(tensors[0].equal(out.hidden));
  EXPECT_FALSE(tensors[1].defined());  // pooled: none
  const BertOutputs back = from_tensors<BertOutputs>(tensors);
  EXPECT_TRUE(back.logits.equal(out.logits));
  EXPECT_EQ(back.loss.item<double>(), 5.0);
  EXPECT_FALSE(back.pooled.defined());
  testing::expect_error<std::logic_error>([&] { from_tensors<FlavaOutputs>(tensors); },
                                          {"a forward returned 4 tensors for an outputs struct of 12 fields"});
}

TEST(Models, BertDebugShapes) {
  Bert m(bert_flavor("bert-debug"));
  at::Tensor ids = at::randint(0, 1000, {2, 10}, at::kLong);
  at::Tensor labels = ids.clone().masked_fill_(at::rand({2, 10}) < 0.5, -100);
  labels[0][0] = ids[0][0];
  BertOutputs out = m->run(ids, at::ones({2, 10}, at::kLong), {}, labels);
  EXPECT_EQ(out.hidden.sizes(), (std::vector<int64_t>{2, 10, 32}));
  EXPECT_EQ(out.pooled.sizes(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, 10, 1000}));
  expect_trainable(out.loss, *m);
}

TEST(Models, VitDebugShapesAndReAttention) {
  for (bool re_attention : {false, true}) {
    VitConfig c = vit_flavor("vit-debug");
    c.re_attention = re_attention;
    Vit m(c);
    VitOutputs out = m->run(at::randn({2, 3, 32, 32}), at::tensor(std::vector<int64_t>{1, 2}));
    EXPECT_EQ(out.hidden.sizes(), (std::vector<int64_t>{2, 17, 32}));
    EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, 10}));
    expect_trainable(out.loss, *m);
  }
  // DeepViT starts as plain attention: the mixing matrix is the identity.
  VitConfig c = vit_flavor("vit-debug");
  c.re_attention = true;
  EXPECT_TRUE(at::equal(Vit(c)->layers[0]->attn->reattn_weights, at::eye(4)));
}

// Random weights for a module built without the zoo's initialisation (its parameters start as at::empty).
void randomize(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(at::randn(p.sizes()) * 0.2);
}

void expect_same_grads(torch::nn::Module& a, torch::nn::Module& b, const std::string& what) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (const auto& item : pa) {
    const at::Tensor& ga = item.value().grad();
    const at::Tensor& gb = pb[item.key()].grad();
    ASSERT_EQ(ga.defined(), gb.defined()) << what << " " << item.key();
    if (ga.defined()) EXPECT_TRUE(at::allclose(ga, gb, 1e-4, 1e-5)) << what << " gradient of " << item.key();
  }
}

// A layer asked for its first k positions computes what the whole layer computes there: outputs and gradients,
// pre- and post-norm, with a padding bias (broadcast over queries) and a full (B, H, T, S) one.
TEST(Models, LayerQueriesMatchTheWholeLayer) {
  for (bool norm_first : {true, false}) {
    for (int bias_kind : {0, 1, 2}) {
      TransformerLayerOptions o;
      o.attention.dim = 16, o.attention.heads = 4, o.mlp_dim = 32, o.norm_first = norm_first;
      TransformerLayer whole(o, at::TensorOptions()), part(o, at::TensorOptions());
      randomize(*whole);
      {
        at::NoGradGuard no_grad;
        for (const auto& item : whole->named_parameters()) part->named_parameters()[item.key()].copy_(item.value());
      }
      const at::Tensor x = at::randn({2, 7, 16});
      at::Tensor bias;
      if (bias_kind == 1) bias = padding_bias(at::tensor({1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0}).view({2, 7}),
                                              at::kFloat);
      if (bias_kind == 2) bias = at::randn({2, 4, 7, 7});
      const std::string what = std::string(norm_first ? "pre" : "post") + "-norm, bias kind " +
                               std::to_string(bias_kind);
      const at::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
      const at::Tensor full = whole->forward(xa, bias, {}, {}, {}, 0).narrow(1, 0, 3);
      const at::Tensor first = part->forward(xb, bias, {}, {}, {}, 3);
      ASSERT_EQ(first.sizes(), (std::vector<int64_t>{2, 3, 16})) << what;
      EXPECT_TRUE(at::allclose(first, full, 1e-5, 1e-6)) << what;
      full.pow(2).sum().backward();
      first.pow(2).sum().backward();
      EXPECT_TRUE(at::allclose(xa.grad(), xb.grad(), 1e-4, 1e-5)) << what;
      expect_same_grads(*whole, *part, what);
    }
  }
  TransformerLayerOptions causal;
  causal.attention.dim = 16, causal.attention.heads = 4, causal.mlp_dim = 32, causal.attention.causal = true;
  TransformerLayer layer(causal, at::TensorOptions());
  expect_error<std::invalid_argument>([&] { layer->forward(at::randn({1, 5, 16}), {}, {}, {}, {}, 2); },
                                      {"queries 2", "causal"});
  causal.attention.causal = false;
  TransformerLayer plain(causal, at::TensorOptions());
  expect_error<std::invalid_argument>([&] { plain->forward(at::randn({1, 5, 16}), {}, {}, {}, {}, 6); },
                                      {"queries 6", "1..5"});
}

// ViT with cls_only (its last layer computes the CLS token only): the same logits, loss and gradients.
TEST(Models, VitClsOnlyMatchesTheWholeModel) {
  for (bool re_attention : {false, true}) {
    VitConfig c = vit_flavor("vit-debug");
    c.re_attention = re_attention;
    Vit whole(c), part(c);
    randomize(*whole);
    {
      at::NoGradGuard no_grad;
      for (const auto& item : whole->named_parameters()) part->named_parameters()[item.key()].copy_(item.value());
    }
    const at::Tensor pixels = at::randn({3, 3, 32, 32}), labels = at::tensor(std::vector<int64_t>{1, 2, 7});
    VitOutputs a = whole->run(pixels, labels), b = part->run(pixels, labels, /*cls_only=*/true);
    EXPECT_EQ(b.hidden.sizes(), (std::vector<int64_t>{3, 1, 32}));
    EXPECT_TRUE(at::allclose(b.hidden, a.hidden.narrow(1, 0, 1), 1e-5, 1e-6)) << re_attention;
    EXPECT_TRUE(at::allclose(b.logits, a.logits, 1e-5, 1e-6)) << re_attention;
    EXPECT_NEAR(b.loss.item<double>(), a.loss.item<double>(), 1e-5);
    a.loss.backward();
    b.loss.backward();
    expect_same_grads(*whole, *part, re_attention ? "DeepViT" : "ViT");
  }
}

// Llama's loss with the LM head at the labelled positions only equals the whole model's, gradients included: with
// right padding (where the padding mask is left out for causal attention alone), with right padding whose padded
// positions still predict labels (kept), and with left padding (kept).
TEST(Models, LlamaLabelledOnlyMatchesTheWholeModel) {
  for (const std::string padding : {"right", "right, labelled", "left"}) {
    Llama whole(llama_flavor("llama-debug")), part(llama_flavor("llama-debug"));
    randomize(*whole);
    {
      at::NoGradGuard no_grad;
      for (const auto& item : whole->named_parameters()) part->named_parameters()[item.key()].copy_(item.value());
    }
    const at::Tensor ids = at::randint(0, 1000, {2, 9}, at::kLong);
    at::Tensor mask = at::ones({2, 9}, at::kLong);
    if (padding == "left") mask[1].narrow(0, 0, 3).zero_();
    else mask[1].narrow(0, 6, 3).zero_();
    const at::Tensor labels = padding == "right, labelled" ? ids : ids.masked_fill(mask == 0, -100);
    LlamaOutputs a = whole->run(ids, mask, labels), b = part->run(ids, mask, labels, /*labelled_only=*/true);
    EXPECT_NEAR(b.loss.item<double>(), a.loss.item<double>(), 1e-5) << padding << " padding";
    a.loss.backward();
    b.loss.backward();
    expect_same_grads(*whole, *part, padding + " padding");
  }
}

// Causal biases: the future hidden (and with a window the far past), padding or a learned bias kept elsewhere; a
// causal attention refuses a bias that does not hide the future itself; a model makes its mask once, not per layer.
TEST(Models, CausalMasksAreMadeOnceForAllLayers) {
  const double low = std::numeric_limits<float>::lowest();
  const at::Tensor rows = at::arange(6).view({6, 1}), cols = at::arange(6).view({1, 6});
  for (int64_t window : {0, 2}) {
    const at::Tensor hidden = (cols > rows) | (window > 0 ? cols <= rows - window : at::zeros({6, 6}, at::kBool));
    const at::Tensor expected = at::where(hidden, low, 0.0).to(at::kFloat).view({1, 1, 6, 6});
    EXPECT_TRUE(at::equal(causal_bias(6, at::kFloat, at::kCPU, window), expected)) << "window " << window;
    const at::Tensor learned = at::randn({1, 3, 6, 6});
    EXPECT_TRUE(at::equal(hide_future(learned, 6, window), at::where(hidden, low, learned))) << "window " << window;
  }
  const at::Tensor padding = padding_bias(at::tensor({1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}).view({2, 6}), at::kFloat);
  const at::Tensor both = hide_future(padding, 6);
  ASSERT_EQ(both.sizes(), (std::vector<int64_t>{2, 1, 6, 6}));
  EXPECT_EQ(both[0][0][5][4].item<double>(), low);   // a padded key
  EXPECT_EQ(both[1][0][2][3].item<double>(), low);   // the future
  EXPECT_EQ(both[1][0][3][2].item<double>(), 0.0);   // the past

  AttentionOptions causal;
  causal.dim = 8, causal.heads = 2, causal.causal = true;
  Attention attention(causal, at::TensorOptions());
  randomize(*attention);
  expect_error<std::invalid_argument>([&] { attention->forward(at::randn({2, 6, 8}), {}, padding, {}); },
                                      {"causal attention over 6 queries", "hide the future", "[2, 1, 1, 6]"});
  // Made with hide_future, the same outputs as the kernel's own causal mask where nothing is padded.
  const at::Tensor x = at::randn({2, 6, 8});
  EXPECT_TRUE(at::allclose(attention->forward(x, {}, causal_bias(6, at::kFloat, at::kCPU), {}),
                           attention->forward(x, {}, {}, {}), 1e-5, 1e-6));

  // Mistral's window over 256 tokens and 4 layers: what forward keeps beyond Llama's (no mask) is one (T, T) mask,
  // where a mask made per layer would keep 4; under autocast (DDP's mixed precision) one in bfloat16, where a float
  // mask would be cast by each layer.
  memory::install_cpu_memory_counter();
  const int64_t tokens = 256;
  for (bool autocast : {false, true}) {
    const int64_t mask = tokens * tokens * (autocast ? 2 : 4);
    int64_t kept[2];
    for (int windowed = 0; windowed < 2; ++windowed) {
      LlamaConfig c = llama_flavor("llama-debug");
      c.layers = 4, c.max_positions = tokens, c.sliding_window = windowed ? 64 : 0;
      Llama model(c);
      const at::Tensor ids = at::randint(0, c.vocab_size, {1, tokens}, at::kLong);
      const int64_t base = memory::cpu_memory_stats().current_bytes;
      at::Tensor loss;
      {
        nn::AutocastGuard guard(c10::DeviceType::CPU, autocast, at::kBFloat16);
        loss = model->run(ids, {}, ids, /*labelled_only=*/true).loss;
      }
      kept[windowed] = memory::cpu_memory_stats().current_bytes - base;
      loss.backward();
    }
    EXPECT_GE(kept[1] - kept[0], mask) << (autocast ? "autocast" : "float32");
    EXPECT_LT(kept[1] - kept[0], 2 * mask) << (autocast ? "autocast" : "float32");
  }
}

TEST(Models, T5LabelledOnlyMatchesTheWholeModel) {
  T5 whole(t5_flavor("t5-debug")), part(t5_flavor("t5-debug"));
  randomize(*whole);
  whole->eval();  // no dropout: the same computation on both
  part->eval();
  {
    at::NoGradGuard no_grad;
    for (const auto& item : whole->named_parameters()) part->named_parameters()[item.key()].copy_(item.value());
  }
  const at::Tensor ids = at::randint(0, 1000, {2, 9}, at::kLong);
  at::Tensor mask = at::ones({2, 9}, at::kLong);
  mask[1].narrow(0, 6, 3).zero_();
  at::Tensor labels = at::randint(0, 1000, {2, 5}, at::kLong);
  labels[1].narrow(0, 3, 2).fill_(-100);  // a shorter target, padded
  T5Outputs a = whole->run(ids, mask, {}, labels), b = part->run(ids, mask, {}, labels, /*labelled_only=*/true);
  EXPECT_FALSE(b.logits.defined());
  EXPECT_NEAR(b.loss.item<double>(), a.loss.item<double>(), 1e-5);
  a.loss.backward();
  b.loss.backward();
  expect_same_grads(*whole, *part, "T5");
}

TEST(Models, LinearCrossEntropyMatchesTheLogitsPath) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor hidden = at::randn({100, 16}).to(dtype), weight = (at::randn({100000, 16}) * 0.3).to(dtype);
    const at::Tensor bias = at::randn({100000}).to(dtype);
    at::Tensor labels = at::randint(0, 100000, {100}, at::kLong);
    labels.narrow(0, 10, 7).fill_(-100);
    std::vector<at::Tensor> grads[2];
    at::Tensor losses[2];
    for (int fused = 0; fused < 2; ++fused) {
      const at::Tensor h = hidden.clone().requires_grad_(), w = weight.clone().requires_grad_();
      const at::Tensor b = bias.clone().requires_grad_();
      losses[fused] = fused ? linear_cross_entropy(h, w, b, labels)
                            : masked_cross_entropy(at::linear(h, w, b), labels);
      (losses[fused] * 3).backward();
      grads[fused] = {h.grad().to(at::kFloat), w.grad().to(at::kFloat), b.grad().to(at::kFloat)};
    }
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    EXPECT_NEAR(losses[1].item<double>(), losses[0].item<double>(), tol * losses[0].abs().item<double>());
    const char* names[] = {"hidden", "weight", "bias"};
    for (int i = 0; i < 3; ++i) {
      const double scale = grads[0][i].abs().max().item<double>();
      EXPECT_LE((grads[1][i] - grads[0][i]).abs().max().item<double>(), tol * scale)
          << names[i] << "'s gradient, " << c10::toString(dtype);
    }
  }
  expect_error<std::invalid_argument>(
      [] { linear_cross_entropy(at::randn({4, 8}), at::randn({10, 7}), {}, at::zeros({4}, at::kLong)); },
      {"linear_cross_entropy", "[4, 8]", "[10, 7]"});
  // No rows (a batch with no label): the weight and bias get zero gradients, not what an empty buffer held.
  const at::Tensor w = at::randn({10, 8}).requires_grad_(), b = at::randn({10}).requires_grad_();
  linear_cross_entropy(at::randn({0, 8}), w, b, at::zeros({0}, at::kLong)).backward();
  EXPECT_TRUE(at::equal(w.grad(), at::zeros_like(w)));
  EXPECT_TRUE(at::equal(b.grad(), at::zeros_like(b)));
  {  // Under no_grad (evaluation): the same loss, no graph, and no weight gradient made (12.8 MB here; the
     // chunk's logits and log-softmax are 2 x 3.2 MB).
    at::NoGradGuard no_grad;
    const at::Tensor big = at::randn({200000, 16}).requires_grad_();
    const at::Tensor h = at::randn({4, 16}), labels = at::randint(0, 200000, {4}, at::kLong);
    memory::install_cpu_memory_counter();
    memory::reset_cpu_peak();
    const int64_t base = memory::cpu_memory_stats().current_bytes;
    const at::Tensor loss = linear_cross_entropy(h, big, {}, labels);
    EXPECT_LT(memory::cpu_memory_stats().peak_bytes - base, big.nbytes());
    EXPECT_FALSE(loss.requires_grad());
    EXPECT_NEAR(loss.item<double>(), masked_cross_entropy(at::linear(h, big), labels).item<double>(), 1e-5);
  }
}

// What linear_cross_entropy allocates in forward, where it computes its gradients too: what the memory model says
// (activation_model's linear_cross_entropy_bytes: kept + forward_transient) in float32, with weights cast to
// bfloat16 (FSDP's mixed precision) and under autocast (DDP's), within 5%. One chunk of 50 rows x 20000 (4 MB of
// float32 logits): at most two float32 copies of it at once (a chunk's logits, log-softmax, the gradient made in
// place in it; 3.5 copies before 2026-11-25, which fails here).
TEST(Models, LinearCrossEntropyAllocatesWhatTheMemoryModelSays) {
  const int64_t rows = 50, vocab = 20000, dim = 16;
  ASSERT_GE(linear_cross_entropy_chunk_rows(vocab), rows);
  memory::install_cpu_memory_counter();
  for (const int mode : {0, 1, 2}) {  // float32, cast to bfloat16, autocast to bfloat16
    const at::ScalarType dtype = mode == 1 ? at::kBFloat16 : at::kFloat;
    const at::Tensor h = at::randn({rows, dim}).to(dtype).requires_grad_();
    const at::Tensor w = (at::randn({vocab, dim}) * 0.3).to(dtype).requires_grad_();
    const at::Tensor labels = at::randint(0, vocab, {rows}, at::kLong);
    ActivationQuery q;
    q.compute = mode == 0 ? at::kFloat : at::kBFloat16, q.autocast = mode == 2;
    const LossBytes predicted = linear_cross_entropy_bytes(rows, vocab, dim, q);
    memory::reset_cpu_peak();
    const int64_t base = memory::cpu_memory_stats().current_bytes;
    at::Tensor loss;
    {
      nn::AutocastGuard autocast(c10::DeviceType::CPU, mode == 2, at::kBFloat16);
      // (Through an alias, as a tied table is read: autocast caches its cast of a leaf until the region ends, and
      // the memory model counts that copy with the other weights' casts.)
      loss = linear_cross_entropy(h, mode == 2 ? w.alias() : w, {}, labels);
    }
    const double peak = static_cast<double>(memory::cpu_memory_stats().peak_bytes - base);
    const double model = static_cast<double>(predicted.kept + predicted.forward_transient);
    EXPECT_NEAR(peak, model, 0.05 * model) << "mode " << mode;
    loss.backward();
    EXPECT_EQ(w.grad().scalar_type(), dtype);
  }
}

// A layer's backward as the memory model walks it (activation_model.h: transformer_layer_transients): first its
// MLP's output projection, whose weight's gradient is made with the MLP's temporaries alive, then attention with
// every parameter's gradient and the MLP's side freed. The peak over one layer's backward, beyond what it kept,
// against the larger moment: a post-norm GELU layer (BERT), a SwiGLU/RMSNorm one (Llama) and a ReLU one with
// dropout everywhere (T5) to the byte, a pre-norm GELU one (ViT) one (B, T, C) tensor over (+10%). All of the
// layer's gradients on top of the largest transient, as the model counted before 2026-11-25, is over by a quarter
// or more (checked here too).
TEST(Models, LayerBackwardPeaksWhereTheMemoryModelSays) {
  const int64_t batch = 4, tokens = 64, dim = 256;
  memory::install_cpu_memory_counter();
  for (int kind = 0; kind < 4; ++kind) {
    TransformerLayerOptions o;
    o.attention.dim = dim, o.attention.heads = 4, o.mlp_dim = 1024;
    o.norm_first = kind != 0;
    if (kind >= 2) {
      o.norm = Norm::kRMSNorm, o.mlp_bias = false;
      o.attention.qkv_bias = o.attention.out_bias = false;
    }
    if (kind == 2) o.activation = Activation::kSwiGlu, o.mlp_dim = 688;
    if (kind == 3) {  // T5's: ReLU, dropout everywhere (attention's: SDPA's math kernel on the CPU)
      o.activation = Activation::kRelu;
      o.dropout = o.mlp_dropout = o.attention.dropout = 0.1;
    }
    TransformerLayer layer(o, torch::TensorOptions());
    int64_t parameters = 0;
    for (const at::Tensor& p : layer->parameters()) parameters += p.numel();
    ActivationQuery q;
    q.batch = batch;
    const LayerTransients t = transformer_layer_transients(o, batch, tokens, 0, q);
    ASSERT_EQ(t.backward.size(), 2u);
    int64_t predicted = 0, largest_transient = 0;
    for (const BackwardMoment& m : t.backward) {
      const int64_t grads = m.gradient_elements < 0 ? parameters : m.gradient_elements;
      predicted = std::max(predicted, m.transient + grads * 4);
      largest_transient = std::max(largest_transient, m.transient);
    }
    const at::Tensor x = at::randn({batch, tokens, dim}).requires_grad_();
    const at::Tensor out = layer->forward(x, {}, {}, {}, {}, 0);
    memory::reset_cpu_peak();
    const int64_t base = memory::cpu_memory_stats().current_bytes;
    out.backward(at::ones_like(out));  // the output's gradient, freed once used, as the layer above's would be
    const double peak = static_cast<double>(memory::cpu_memory_stats().peak_bytes - base);
    std::printf("  layer %d: backward peak %.2f MB above what it kept, the model %.2f MB (moments", kind, peak / 1e6,
                predicted / 1e6);
    for (const BackwardMoment& m : t.backward) {
      std::printf(" %.2f", (m.transient + (m.gradient_elements < 0 ? parameters : m.gradient_elements) * 4) / 1e6);
    }
    std::printf(")\n");
    EXPECT_NEAR(peak, predicted, 0.12 * predicted) << "layer " << kind;
    EXPECT_GT(static_cast<double>(largest_transient + parameters * 4), 1.25 * peak) << "layer " << kind;
  }
}

// A table tied to an output projection (BERT's decoder, T5's head): read through tie_table(), the lookups'
// gradient is their rows, added in place into the projection's dense gradient, so the two never both exist as dense
// tables — and .grad is the same dense tensor as with plain lookups, also when the projection is not used.
TEST(Models, TiedTableAddsTheLookupsRowsIntoTheHeadsGradient) {
  const int64_t vocab = 100000, dim = 16;  // the table: 6.4 MB at float32
  const at::Tensor table = at::randn({vocab, dim}) * 0.1, ids = at::randint(0, vocab, {4, 8}, at::kLong);
  const at::Tensor labels = at::randint(0, vocab, {2}, at::kLong), bias = at::randn({vocab});
  memory::install_cpu_memory_counter();
  // float16: CPU cannot add two sparse gradients together (two lookups of one alias failed so).
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
    // head 0: none; 1: a projection with a bias (BERT's decoder); 2: linear_cross_entropy (T5's labelled head).
    for (int head = 0; head < 3; ++head) {
      at::Tensor grads[2], bias_grads[2];
      int64_t peaks[2] = {0, 0};
      for (int tied = 0; tied < 2; ++tied) {
        const at::Tensor weight = table.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
        const at::Tensor b = bias.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
        const TiedTable w = tied ? tie_table(weight, 2) : TiedTable{{weight, weight}, weight};
        int64_t looked_up = 0;  // each lookup reads an alias of its own
        auto lookup = [&] { return tied ? sparse_lookup(w.lookups[looked_up++], ids) : at::embedding(weight, ids); };
        // Two lookups (T5's encoder and decoder); the head reads two positions, its logits (2, vocab) small beside
        // the table's gradient.
        const at::Tensor x = lookup();  // (4, 8, dim)
        at::Tensor loss = x.to(at::kFloat).pow(2).mean() + lookup().to(at::kFloat).mean();
        const at::Tensor h = x.select(1, 0).narrow(0, 0, 2);
        if (head == 1) {
          loss = loss + masked_cross_entropy(tied ? tied_projection(h, w.head, b) : at::linear(h, weight, b), labels);
        } else if (head == 2) {
          loss = loss + linear_cross_entropy(h, w.head, {}, labels);
        }
        memory::reset_cpu_peak();
        const int64_t base = memory::cpu_memory_stats().current_bytes;
        loss.backward();
        peaks[tied] = memory::cpu_memory_stats().peak_bytes - base;
        const std::string what = "head " + std::to_string(head) + ", " + c10::toString(dtype);
        ASSERT_FALSE(weight.grad().is_sparse()) << what;
        grads[tied] = weight.grad().to(at::kFloat);
        if (head == 1) bias_grads[tied] = b.grad().to(at::kFloat);
      }
      const std::string what = "head " + std::to_string(head) + ", " + c10::toString(dtype);
      EXPECT_LE((grads[1] - grads[0]).abs().max().item<double>(), tol * grads[0].abs().max().item<double>()) << what;
      if (head == 1) {
        EXPECT_LE((bias_grads[1] - bias_grads[0]).abs().max().item<double>(),
                  tol * bias_grads[0].abs().max().item<double>()) << what;
      }
      if (head == 0) continue;
      // Plain: the head's gradient and the lookups', each table-sized, summed; tied: one table and the rows.
      const int64_t table_bytes = vocab * dim * static_cast<int64_t>(c10::elementSize(dtype));
      EXPECT_GE(peaks[0] - peaks[1], table_bytes * 9 / 10) << what;
      EXPECT_LT(peaks[1], table_bytes * 3 / 2) << what;
    }
  }
}

// The MLP's activation and output projection are one node keeping only the activation's inputs (fused_mlp.h): the
// same outputs and gradients as the layers one by one, and a (rows, hidden) tensor less kept with GELU, two with
// SwiGLU (allocator accounting: the bytes alive after forward).
TEST(Models, FusedMlpMatchesTheLayersAndKeepsLess) {
  const int64_t dim = 32, hidden = 256, rows = 4 * 64;
  const int64_t m = rows * hidden * 4;  // one (rows, hidden) float32 tensor
  memory::install_cpu_memory_counter();
  for (const Activation act : {Activation::kGelu, Activation::kGeluTanh, Activation::kSwiGlu}) {
    const bool swiglu = act == Activation::kSwiGlu;
    const std::string what = swiglu ? "swiglu" : act == Activation::kGelu ? "gelu" : "gelu tanh";
    Mlp mlp(dim, hidden, act, /*bias=*/true, /*dropout=*/0.0, at::TensorOptions());
    for (auto& p : mlp->parameters()) {
      at::NoGradGuard no_grad;
      p.normal_(0, 0.1);
    }
    const at::Tensor input = at::randn({4, 64, dim});
    auto unfused = [&](const at::Tensor& x) {
      if (swiglu) return mlp->down->forward(at::silu(mlp->gate->forward(x)) * mlp->up->forward(x));
      return mlp->fc2->forward(at::gelu(mlp->fc1->forward(x), act == Activation::kGeluTanh ? "tanh" : "none"));
    };
    at::Tensor outs[2];
    int64_t kept[2];
    std::vector<at::Tensor> grads[2];
    for (int fused = 0; fused < 2; ++fused) {
      const at::Tensor x = input.clone().requires_grad_();
      const int64_t base = memory::cpu_memory_stats().current_bytes;
      outs[fused] = fused ? mlp->forward(x) : unfused(x);
      kept[fused] = memory::cpu_memory_stats().current_bytes - base;
      (outs[fused] * outs[fused]).sum().backward();
      grads[fused].push_back(x.grad().clone());
      for (auto& p : mlp->parameters()) {
        grads[fused].push_back(p.grad().clone());
        p.mutable_grad() = at::Tensor();
      }
    }
    EXPECT_TRUE(at::allclose(outs[1], outs[0], 1e-5, 1e-6)) << what;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i], 1e-4, 1e-5)) << what << ", gradient " << i;
    }
    EXPECT_LE(kept[1], kept[0] - (swiglu ? 2 : 1) * m) << what;
    // Under autocast (DDP's mixed precision): products in bfloat16 forward and backward, float32 gradients.
    for (int fused = 0; fused < 2; ++fused) {
      const at::Tensor x = input.clone().requires_grad_();
      {
        nn::AutocastGuard autocast(c10::DeviceType::CPU, true, at::kBFloat16);
        outs[fused] = fused ? mlp->forward(x) : unfused(x);
      }
      outs[fused].to(at::kFloat).pow(2).sum().backward();
      grads[fused] = {x.grad().clone()};
      for (auto& p : mlp->parameters()) {
        EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << what;
        grads[fused].push_back(p.grad().clone());
        p.mutable_grad() = at::Tensor();
      }
    }
    EXPECT_TRUE(at::allclose(outs[1].to(at::kFloat), outs[0].to(at::kFloat), 2e-2, 1e-2)) << what << ", autocast";
    for (size_t i = 0; i < grads[0].size(); ++i) {
      const double scale = grads[0][i].abs().max().item<double>();
      EXPECT_LE((grads[1][i] - grads[0][i]).abs().max().item<double>(), 3e-2 * scale)
          << what << ", autocast, gradient " << i;
    }
  }
}

TEST(Models, LlamaAndT5DebugShapes) {
  Llama llama(llama_flavor("llama-debug"));
  at::Tensor ids = at::randint(0, 1000, {2, 9}, at::kLong);
  LlamaOutputs l = llama->run(ids, {}, ids);
  EXPECT_EQ(l.logits.sizes(), (std::vector<int64_t>{2, 9, 1000}));
  expect_trainable(l.loss, *llama);

  T5 t5(t5_flavor("t5-debug"));
  T5Outputs t = t5->run(ids, {}, {}, at::randint(0, 1000, {2, 5}, at::kLong));
  EXPECT_EQ(t.logits.sizes(), (std::vector<int64_t>{2, 5, 1000}));
  expect_trainable(t.loss, *t5);
}

TEST(Models, FlavaDebugAllBatchKinds) {
  Flava m(flava_flavor("flava-debug"));
  const int64_t b = 3;
  at::Tensor ids = at::randint(0, 1000, {b, 8}, at::kLong);
  at::Tensor mlm = at::full({b, 8}, -100, at::kLong);
  mlm.select(1, 2).copy_(ids.select(1, 2));
  at::Tensor masked = at::rand({b, 16}) < 0.5;
  masked.select(1, 0).fill_(true);
  FlavaBatch batch{ids, ids, at::ones({b, 8}, at::kLong), at::randn({b, 3, 32, 32}), at::rand({b, 3, 32, 32}),
                   masked, mlm, {}, at::tensor(std::vector<int64_t>{1, 0, 1})};
  FlavaOutputs mm = m->run(batch);
  for (const at::Tensor* l : {&mm.itm, &mm.global_contrastive, &mm.mmm_image, &mm.mmm_text}) EXPECT_TRUE(l->defined());
  EXPECT_EQ(mm.logits_per_image.sizes(), (std::vector<int64_t>{2, 3}));  // matching pairs x all texts
  expect_trainable(mm.loss, *m);
  for (const auto& p : m->image_codebook->parameters()) EXPECT_FALSE(p.grad().defined()) << "the codebook is frozen";

  FlavaBatch text;
  text.input_ids = ids, text.mlm_labels = mlm;
  FlavaOutputs t = m->run(text);
  EXPECT_TRUE(t.mlm.defined() && !t.itm.defined());
  FlavaBatch image;
  image.pixels = batch.pixels, image.codebook_pixels = batch.codebook_pixels, image.masked_patches = masked;
  FlavaOutputs i = m->run(image);
  EXPECT_TRUE(i.mim.defined() && !i.mlm.defined());
  EXPECT_TRUE(std::isfinite(t.loss.item<double>()) && std::isfinite(i.loss.item<double>()));

  image.codebook_pixels = at::Tensor();
  expect_error<std::invalid_argument>([&] { m->run(image); }, {"mim_labels or codebook_pixels"});
}

// Weights are a function of (seed, name): the same for any construction order or layer hook, different by seed.
TEST(Models, InitDependsOnSeedAndNamesOnly) {
  BuildOptions a;
  a.init.seed = 7;
  BuildOptions b = a;
  std::vector<std::string> seen;
  b.on_layer = [&seen](const std::string& name, const std::shared_ptr<torch::nn::Module>&) { seen.push_back(name); };
  Bert x(bert_flavor("bert-debug"), a), y(bert_flavor("bert-debug"), b);
  EXPECT_EQ(seen, (std::vector<std::string>{"layers.0", "layers.1"}));
  auto px = x->named_parameters(), py = y->named_parameters();
  for (const auto& p : px) EXPECT_TRUE(at::equal(p.value(), py[p.key()])) << p.key();
  BuildOptions c;
  c.init.seed = 8;
  EXPECT_FALSE(at::equal(Bert(bert_flavor("bert-debug"), c)->layers[0]->attn->q->weight, x->layers[0]->attn->q->weight));
  EXPECT_TRUE(at::equal(x->layers[0]->norm1.ptr()->named_parameters()["weight"], at::ones({32})));
  EXPECT_TRUE(at::equal(x->layers[0]->attn->q->bias, at::zeros({32})));
}

TEST(Models, ZooNamesFlavorsAndSuggests) {
  EXPECT_EQ(build_model("t5-debug").layer_class, "T5Block");
  expect_error<std::invalid_argument>([] { build_model("flava-10"); }, {"'flava-10'", "did you mean 'flava-10b'"});
  // Counting builds on the meta device: llama-3-70b's 282 GB of float32 are never allocated.
  EXPECT_EQ(count_flavor_parameters("llama-3-70b"), 70553706496);
}

TEST(Safetensors, RoundTripDtypesAndMetadata) {
  TempDir dir;
  const std::string path = dir.path + "/t.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"b.f32", at::randn({3, 4})},
      {"a.bf16", at::randn({5}).to(at::kBFloat16)},
      {"c.i64", at::arange(6, at::kLong).view({2, 3})},
      {"d.bool", at::rand({4}) < 0.5},
      {"e.scalar", at::tensor(2.5)},
      {"f.empty", at::empty({0, 3})}};
  io::write_safetensors(path, tensors, {{"format", "pt"}});
  io::SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    at::Tensor back = r.read(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
  }
}

// A model directory's weights as save_pretrained writes them: shards in order under a size limit and an index, read
// back as one; a second write in the other layout removes the first's files.
TEST(Safetensors, ShardedDirectoryRoundTrip) {
  TempDir dir;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int i = 0; i < 5; ++i) tensors.push_back({"t" + std::to_string(i), at::randn({10 + i})});  // 40-56 bytes each
  const auto sharded = io::write_safetensors_files(dir.path, tensors, 100);  // two tensors fit a shard
  EXPECT_EQ(sharded, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                               "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  io::WeightFiles back(dir.path);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(back.read(name), t)) << name;
  EXPECT_EQ(io::SafetensorsReader(dir.path + "/model-00001-of-00003.safetensors").metadata().at("format"), "pt");
  EXPECT_EQ(io::write_safetensors_files(dir.path, tensors, 1000), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(io::path_exists(dir.path + "/model.safetensors.index.json"));
  EXPECT_FALSE(io::path_exists(dir.path + "/model-00001-of-00003.safetensors"));
  EXPECT_TRUE(at::equal(io::WeightFiles(dir.path).read("t4"), tensors[4].second));
}

TEST(Safetensors, WeightsRoundTripUnderHfNames) {
  TempDir dir;
  const std::string path = dir.path + "/model.safetensors";
  BuildOptions seed1;
  seed1.init.seed = 1;
  Bert a(bert_flavor("bert-debug"), seed1), b(bert_flavor("bert-debug"));
  save_weights(*a, path, bert_names());
  io::SafetensorsReader r(path);
  EXPECT_NE(r.find("bert.encoder.layer.1.attention.self.query.weight"), nullptr);
  EXPECT_NE(r.find("cls.predictions.bias"), nullptr);
  load_weights(*b, path, bert_names());
  for (const auto& p : a->named_parameters()) EXPECT_TRUE(at::equal(p.value(), b->named_parameters()[p.key()]));

  save_weights(*a, path, bert_names(), at::kBFloat16);  // saved in bf16, loaded into float32
  EXPECT_EQ(io::SafetensorsReader(path).find("cls.predictions.bias")->dtype, at::kBFloat16);
  load_weights(*b, path, bert_names());
  EXPECT_TRUE(at::equal(b->mlm_bias, a->mlm_bias.to(at::kBFloat16).to(at::kFloat)));
}

std::vector<char> header_file(const std::string& json, size_t data_bytes) {
  std::vector<char> bytes(8 + json.size() + data_bytes, 0);
  uint64_t n = json.size();
  std::memcpy(bytes.data(), &n, 8);  // little-endian host
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  return bytes;
}

TEST(Safetensors, ValidationNamesTheProblem) {
  TempDir dir;
  const std::string path = dir.path + "/bad.safetensors";
  auto check = [&](const std::vector<char>& bytes, std::initializer_list<std::string> needles) {
    io::write_file_atomic(path, bytes);
    expect_error<std::runtime_error>([&] { io::SafetensorsReader r(path); }, needles);
  };
  check({'x', 'y'}, {"shorter than the 8-byte header length"});
  std::vector<char> too_long = header_file("{}", 0);
  too_long[0] = 100;
  check(too_long, {"header length 100 exceeds"});
  check(header_file("{not json", 0), {"not valid JSON"});
  check(header_file(R"({"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", 4), {"tensor 'w'", "dtype 'F99'"});
  check(header_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), {"tensor 'w'", "need 8"});
  check(header_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 4), {"tensor 'w'", "outside"});
  check(header_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"tensor 'w'", "non-natural"});
  check(header_file(R"({"u":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12),
        {"'u' and 'v' overlap"});

  // Against a model: missing, mis-shaped and unexpected tensors are named.
  Bert model(bert_flavor("bert-debug"));
  auto tensors = hf_named_tensors(*model, bert_names());
  auto without = tensors;  // a head may be missing (it keeps its initialization); the body may not
  const auto body = std::find_if(without.begin(), without.end(),
                                 [](const auto& t) { return t.first.find("encoder") != std::string::npos; });
  const std::string absent = body->first;
  without.erase(body);
  io::write_safetensors(path, without);
  expect_error<std::runtime_error>([&] { load_weights(*model, path, bert_names()); }, {"'" + absent + "'", "missing"});
  auto reshaped = tensors;
  reshaped.back().second = at::zeros({7});
  io::write_safetensors(path, reshaped);
  expect_error<std::runtime_error>([&] { load_weights(*model, path, bert_names()); },
                                   {"'" + tensors.back().first + "'", "shape [7]"});
  auto extra = tensors;
  extra.emplace_back("bert.encoder.layer.9.output.dense.weight", at::zeros({1}));
  io::write_safetensors(path, extra);
  expect_error<std::runtime_error>([&] { load_weights(*model, path, bert_names()); },
                                   {"'bert.encoder.layer.9.output.dense.weight'", "matches nothing"});
}

}  // namespace
}  // namespace shardtrain::models
