// LoRA (models/lora.h) without a process group: the adapted Linear's arithmetic, what a LoRA recipe adapts, freezes
// and trains, the merge and the PEFT adapter's names, loading a base model's weights, the memory model's count of
// what trains, and errors naming what was expected. Training under FSDP and DDP: tests/multiprocess/models_test.cpp
// (LoraAdaptersTrainLikeOneProcess); against PEFT itself: tests/train/lora_test.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "shardtrain/config/config.h"
#include "shardtrain/io/files.h"
#include "shardtrain/models/blocks.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/plan/memory_model.h"
#include "support/expect_error.h"

namespace shardtrain::models {
namespace {

using testing::expect_error;

LoraSpec spec_of(int64_t r, double alpha, std::vector<std::string> targets = {}) {
  LoraSpec s;
  s.r = r, s.lora_alpha = alpha, s.target_modules = std::move(targets);
  return s;
}

TEST(Lora, AdaptedLinearAddsTheScaledLowRankProduct) {
  at::manual_seed(1);
  Linear linear(6, 5, true, at::TensorOptions().dtype(at::kDouble));
  for (auto& p : linear->parameters()) p.detach().normal_();
  const at::Tensor x = at::randn({3, 4, 6}, at::kDouble);
  const at::Tensor base = linear->forward(x);
  linear->add_lora(2, 6, 0.0);
  EXPECT_EQ(linear->lora_A->weight.sizes(), (at::IntArrayRef{2, 6}));
  EXPECT_EQ(linear->lora_B->weight.sizes(), (at::IntArrayRef{5, 2}));
  at::NoGradGuard no_grad;
  linear->lora_A->weight.normal_();
  linear->lora_B->weight.zero_();
  EXPECT_TRUE(at::allclose(linear->forward(x), base));  // B = 0: the base layer
  linear->lora_B->weight.normal_();
  const at::Tensor delta = at::matmul(linear->lora_B->weight, linear->lora_A->weight) * 3.0;  // alpha / r = 3
  EXPECT_TRUE(at::allclose(linear->forward(x), at::linear(x, linear->weight + delta, linear->bias)));
  // merge_lora does the same with the tensors under any names
  const auto merged = merge_lora({{"m.weight", linear->weight}, {"m.bias", linear->bias},
                                  {"m.lora_A.weight", linear->lora_A->weight},
                                  {"m.lora_B.weight", linear->lora_B->weight}},
                                 spec_of(2, 6), NameMap{});
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].first, "m.weight");
  EXPECT_TRUE(at::allclose(merged[0].second, linear->weight + delta));
  EXPECT_TRUE(at::equal(merged[1].second, linear->bias));
  expect_error<std::invalid_argument>([&] { linear->add_lora(2, 6, 0.0); }, {"already"});
  expect_error<std::invalid_argument>(
      [&] { merge_lora({{"m.lora_A.weight", linear->lora_A->weight}}, spec_of(2, 6), {}); },
      {"'m.lora_A.weight' has no m.lora_B.weight"});
  // Dropout on the adapter's input only, in training: in eval the output is deterministic.
  Linear dropped(6, 5, true, at::TensorOptions().dtype(at::kDouble));
  for (auto& p : dropped->parameters()) p.detach().normal_();
  dropped->add_lora(2, 2, 0.5);
  for (auto& p : dropped->parameters()) p.detach().normal_();
  dropped->eval();
  EXPECT_TRUE(at::equal(dropped->forward(x), dropped->forward(x)));
  dropped->train();
  EXPECT_FALSE(at::equal(dropped->forward(x), dropped->forward(x)));
}

// An adapter on the MLP's output projection joins the fused activation + projection node (fused_mlp.h): the same
// output and the same gradients, for every input and weight, as the plain composition of the modules.
// Hugging Face's Conv1D layout (GPT-2): weight (in, out), y = x W + b; the adapter keeps PEFT's shapes and a merge
// adds (B A)^T, PEFT's fan_in_fan_out.
TEST(Lora, TransposedLinearAdaptsAndMergesAsConv1D) {
  at::manual_seed(2);
  Linear conv(6, 5, true, at::TensorOptions().dtype(at::kDouble), /*transposed=*/true);
  ASSERT_EQ(conv->weight.sizes(), (at::IntArrayRef{6, 5}));
  for (auto& p : conv->parameters()) p.detach().normal_();
  const at::Tensor x = at::randn({3, 4, 6}, at::kDouble);
  EXPECT_TRUE(at::allclose(conv->forward(x), at::matmul(x, conv->weight) + conv->bias));
  conv->add_lora(2, 4, 0.0);
  EXPECT_EQ(conv->lora_A->weight.sizes(), (at::IntArrayRef{2, 6}));
  EXPECT_EQ(conv->lora_B->weight.sizes(), (at::IntArrayRef{5, 2}));
  at::NoGradGuard no_grad;
  for (auto& p : conv->parameters()) p.detach().normal_();
  const at::Tensor delta = at::matmul(conv->lora_B->weight, conv->lora_A->weight) * 2.0;  // (out, in), alpha / r = 2
  EXPECT_TRUE(at::allclose(conv->forward(x), at::matmul(x, conv->weight + delta.t()) + conv->bias));
  const NameMap conv1d({}, {}, {}, {}, {"^m\\.weight$"});
  const auto merged = merge_lora({{"m.weight", conv->weight}, {"m.lora_A.weight", conv->lora_A->weight},
                                  {"m.lora_B.weight", conv->lora_B->weight}},
                                 spec_of(2, 4), conv1d);
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_TRUE(at::allclose(merged[0].second, conv->weight + delta.t()));
}

TEST(Lora, AdaptedOutputProjectionFusesAsItComposes) {
  for (const Activation activation : {Activation::kSwiGlu, Activation::kGelu, Activation::kGeluTanh}) {
    at::manual_seed(2);
    Mlp mlp(6, 10, activation, /*bias=*/true, /*dropout=*/0.0, at::TensorOptions().dtype(at::kDouble));
    Linear& out = activation == Activation::kSwiGlu ? mlp->down : mlp->fc2;
    out->add_lora(3, 6, 0.0);
    for (auto& p : mlp->parameters()) p.detach().normal_();
    const at::Tensor x = at::randn({2, 5, 6}, at::kDouble).requires_grad_(true);
    auto grads_of = [&](const at::Tensor& y) {
      for (auto& p : mlp->parameters()) p.mutable_grad() = at::Tensor();
      x.mutable_grad() = at::Tensor();
      (y * at::linspace(-1, 1, y.numel(), at::kDouble).view(y.sizes())).sum().backward();
      std::vector<at::Tensor> g = {x.grad().clone()};
      for (const auto& p : mlp->parameters()) g.push_back(p.grad().clone());
      return g;
    };
    const at::Tensor fused = mlp->forward(x);
    const auto fused_grads = grads_of(fused);
    const at::Tensor hidden = activation == Activation::kSwiGlu ? at::silu(mlp->gate->forward(x)) * mlp->up->forward(x)
                              : at::gelu(mlp->fc1->forward(x), activation == Activation::kGeluTanh ? "tanh" : "none");
    const at::Tensor composed = out->forward(hidden);
    const auto composed_grads = grads_of(composed);
    EXPECT_TRUE(at::allclose(fused, composed));
    ASSERT_EQ(fused_grads.size(), composed_grads.size());
    for (size_t i = 0; i < fused_grads.size(); ++i) {
      EXPECT_TRUE(at::allclose(fused_grads[i], composed_grads[i])) << "gradient " << i;
    }
  }
}

TEST(Lora, RecipeAdaptsTheTargetsAndTrainsOnlyThem) {
  // llama-debug's defaults: q_proj and v_proj of both layers, PEFT's default for Llama; every other weight frozen.
  const auto llama = with_lora(recipe_of("llama-debug"), spec_of(4, 8));
  BuildOptions build;
  build.init.seed = 3;
  const auto model = llama->build(build);
  std::vector<std::string> trainable;
  for (const auto& p : model->named_parameters()) {
    if (p.value().requires_grad()) trainable.push_back(p.key());
  }
  EXPECT_EQ(trainable, (std::vector<std::string>{"layers.0.attn.q.lora_A.weight", "layers.0.attn.q.lora_B.weight",
                                                 "layers.0.attn.v.lora_A.weight", "layers.0.attn.v.lora_B.weight",
                                                 "layers.1.attn.q.lora_A.weight", "layers.1.attn.q.lora_B.weight",
                                                 "layers.1.attn.v.lora_A.weight", "layers.1.attn.v.lora_B.weight"}));
  // PEFT's initialisation: A uniform within 1/sqrt(in), B zero; seeded by name (the same build twice is the same).
  const auto params = model->named_parameters();
  const at::Tensor a = params["layers.0.attn.q.lora_A.weight"];
  const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GT(a.abs().max().item<double>(), 0.8 * bound);
  EXPECT_EQ(params["layers.0.attn.q.lora_B.weight"].abs().max().item<double>(), 0.0);
  EXPECT_TRUE(at::equal(llama->build(build)->named_parameters()["layers.0.attn.q.lora_A.weight"], a));
  EXPECT_FALSE(at::equal(params["layers.1.attn.q.lora_A.weight"], a));

  const LoraTargets t = lora_targets(*llama, spec_of(4, 8));
  EXPECT_EQ(t.target_modules, (std::vector<std::string>{"self_attn.q_proj", "self_attn.v_proj"}));
  EXPECT_TRUE(t.modules_to_save.empty());
  EXPECT_EQ(t.adapted_modules, 4);
  int64_t trained = 0;
  for (const auto& name : trainable) trained += params[name].numel();
  EXPECT_EQ(t.trainable, trained);
  EXPECT_EQ(t.total, count_parameters(*model));

  // BERT classification: the classifier (new, for the task) trains whole, as PEFT's SEQ_CLS saves it, and the
  // pooler it reads. all-linear adapts the six Linears of every layer.
  const auto classifier = recipe_for_task(recipe_of("bert-debug"), "classify",
                                          {{"no", "yes"}, false, std::nullopt, std::nullopt});
  const auto bert = with_lora(classifier, spec_of(2, 4, {"all-linear"}));
  const LoraTargets b = lora_targets(*bert, spec_of(2, 4, {"all-linear"}));
  // by their names inside a layer: "output.dense" (the attention's and the layer's) matches no pooler "dense"
  EXPECT_EQ(b.target_modules, (std::vector<std::string>{"attention.self.query", "attention.self.key",
                                                         "attention.self.value", "attention.output.dense",
                                                         "intermediate.dense", "output.dense"}));
  EXPECT_EQ(b.adapted_modules, 2 * 6);
  EXPECT_EQ(b.modules_to_save, (std::vector<std::string>{"pooler", "classifier"}));
  const auto bert_model = bert->build(meta_build());
  const auto bp = bert_model->named_parameters();
  EXPECT_TRUE(bp["classifier.weight"].requires_grad());
  EXPECT_TRUE(bp["pooler.weight"].requires_grad());
  EXPECT_FALSE(bp["embeddings.word.weight"].requires_grad());
  EXPECT_FALSE(bp["layers.0.attn.q.weight"].requires_grad());

  // A model without a classifier keeps its poolers frozen (FLAVA's text, image and multimodal ones).
  const auto flava = with_lora(recipe_of("flava-debug"), spec_of(2, 4));
  EXPECT_TRUE(lora_targets(*flava, spec_of(2, 4)).modules_to_save.empty());

  // The memory model counts what trains: gradients and optimizer state for the adapters and the classifier only.
  const plan::ModelShape shape = plan::model_shape(*bert);
  int64_t trainable_elements = 0;
  for (int64_t n : shape.trainable_in_order) trainable_elements += n;
  EXPECT_EQ(trainable_elements, b.trainable);
  EXPECT_LT(b.trainable, b.total / 10);

  // The PEFT adapter file's names and config.
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"bert.encoder.layer.0.attention.self.query.weight", at::zeros({2, 2})},
      {"bert.encoder.layer.0.attention.self.query.lora_A.weight", at::zeros({1, 2})},
      {"bert.encoder.layer.0.attention.self.query.lora_B.weight", at::zeros({2, 1})},
      {"bert.pooler.dense.weight", at::zeros({2, 2})}, {"classifier.weight", at::zeros({2, 2})},
      {"classifier.bias", at::zeros({2})}};
  std::vector<std::string> names;
  for (const auto& [name, t] : lora_adapter_tensors(tensors, b)) names.push_back(name);
  const std::string peft = "base_model.model.";
  EXPECT_EQ(names, (std::vector<std::string>{peft + "bert.encoder.layer.0.attention.self.query.lora_A.weight",
                                             peft + "bert.encoder.layer.0.attention.self.query.lora_B.weight",
                                             peft + "bert.pooler.dense.weight", peft + "classifier.weight",
                                             peft + "classifier.bias"}));
  const auto config = nlohmann::json::parse(lora_adapter_config(spec_of(2, 4), b, "classify", "/models/bert"));
  EXPECT_EQ(config.at("peft_type"), "LORA");
  EXPECT_EQ(config.at("task_type"), "SEQ_CLS");
  EXPECT_EQ(config.at("r"), 2);
  EXPECT_EQ(config.at("lora_alpha"), 4.0);
  EXPECT_EQ(config.at("modules_to_save"), nlohmann::json({"pooler", "classifier"}));
  EXPECT_EQ(config.at("base_model_name_or_path"), "/models/bert");
}

TEST(Lora, BaseModelWeightsLoadWithTheAdaptersLeftAsInitialised) {
  const std::string dir = "/tmp/shardtrain_lora_test_" + std::to_string(::getpid());
  io::make_directories(dir);
  BuildOptions build;
  build.init.seed = 1;
  const auto base = recipe_of("llama-debug");
  save_weights(*base->build(build), dir + "/model.safetensors", base->hf_names());
  const auto adapted = with_lora(base, spec_of(4, 8));
  build.init.seed = 2;  // other base weights, so the load shows
  const auto model = adapted->build(build);
  const at::Tensor a_before = model->named_parameters()["layers.0.attn.q.lora_A.weight"].detach().clone();
  const LoadReport report = load_weights(*model, dir + "/model.safetensors", adapted->hf_names());
  EXPECT_TRUE(report.initialized.empty());  // the adapters are not reported as missing
  const auto loaded = model->named_parameters(), saved = base->build([] {
    BuildOptions b;
    b.init.seed = 1;
    return b;
  }())->named_parameters();
  EXPECT_TRUE(at::equal(loaded["layers.0.attn.q.weight"], saved["layers.0.attn.q.weight"]));
  EXPECT_TRUE(at::equal(loaded["layers.0.attn.q.lora_A.weight"], a_before));
  io::remove_tree(dir);
}

TEST(Lora, BadSpecsNameWhatWasExpected) {
  const auto llama = recipe_of("llama-debug");
  expect_error<std::invalid_argument>([&] { with_lora(llama, spec_of(-1, 8)); }, {"model.lora.r is -1"});
  expect_error<std::invalid_argument>([&] { with_lora(llama, spec_of(4, 0)); }, {"model.lora.lora_alpha is 0"});
  LoraSpec dropout = spec_of(4, 8);
  dropout.lora_dropout = 1;
  expect_error<std::invalid_argument>([&] { with_lora(llama, dropout); }, {"lora_dropout", "[0, 1)"});
  // A target no Linear of the layers has: named, with the layers' own (q_proj ... down_proj).
  expect_error<std::invalid_argument>([&] { with_lora(llama, spec_of(4, 8, {"q_proj", "query"}))->build(meta_build()); },
                                      {"'query' is no Linear module", "q_proj, k_proj, v_proj, o_proj", "all-linear"});
  LoraSpec save = spec_of(4, 8);
  save.modules_to_save = {"clasifier"};
  expect_error<std::invalid_argument>([&] { with_lora(llama, save)->build(meta_build()); },
                                      {"modules_to_save: 'clasifier' is no module"});
  EXPECT_EQ(with_lora(llama, spec_of(0, 8)), llama);  // r 0: no LoRA, the recipe itself
}

// model.lora.from: the adapter's adapter_config.json gives the LoRA's shape; what shardtrain does not train as PEFT
// would is refused by its key, and a config's own r or targets must be the adapter's.
TEST(Lora, AdapterConfigGivesTheShape) {
  const std::string dir = "/tmp/shardtrain_lora_adapter_" + std::to_string(::getpid());
  io::make_directories(dir);
  auto parse = [&](const std::string& json, const std::string& lora = "") {
    std::ofstream(dir + "/adapter_config.json") << json;
    return config::parse_config("model: {flavor: llama-debug, lora: {from: " + dir + lora + "}}\n", "test.yaml");
  };
  const std::string peft = R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "bias": "none",
      "target_modules": ["q_proj", "v_proj"], "modules_to_save": null, "use_dora": false, "use_rslora": false,
      "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": null})";
  const config::Config c = parse(peft);
  EXPECT_EQ(c.model.lora.r, 16);
  EXPECT_EQ(c.model.lora.lora_alpha, 32);
  EXPECT_EQ(c.model.lora.lora_dropout, 0.05);
  EXPECT_EQ(c.model.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_TRUE(c.model.lora.modules_to_save.empty());
  // Written back and read again with the directory gone (an export long after the run): what was read stays.
  const std::string yaml = config::to_yaml(c);
  io::remove_tree(dir);
  EXPECT_EQ(config::parse_config(yaml, "recorded").model.lora.r, 16);
  io::make_directories(dir);
  EXPECT_EQ(parse(R"({"peft_type": "LORA", "r": 4, "target_modules": "all-linear"})").model.lora.target_modules,
            (std::vector<std::string>{"all-linear"}));
  expect_error<config::ConfigError>([&] { parse(R"({"peft_type": "IA3"})"); }, {"peft_type: 'IA3'"});
  expect_error<config::ConfigError>([&] { parse(R"({"peft_type": "LORA", "use_dora": true})"); }, {"use_dora: true"});
  expect_error<config::ConfigError>([&] { parse(R"({"peft_type": "LORA", "bias": "all"})"); }, {"bias: 'all'"});
  expect_error<config::ConfigError>([&] { parse(R"({"peft_type": "LORA", "target_modules": ".*proj"})"); },
                                    {"'.*proj' (a regular expression)"});
  expect_error<config::ConfigError>([&] { parse(R"({"peft_type": "LORA", "rank_pattern": {"q_proj": 2}})"); },
                                    {"rank_pattern"});
  expect_error<config::ConfigError>([&] { parse(peft, ", r: 8"); }, {"model.lora.r is 8 but the adapter", "r 16"});
  expect_error<config::ConfigError>([&] { parse(peft, ", target_modules: [q_proj]"); },
                                    {"model.lora.target_modules differ"});
  io::remove_tree(dir);
  expect_error<config::ConfigError>(
      [&] { config::parse_config("model: {flavor: llama-debug, lora: {from: " + dir + "}}\n", "test.yaml"); },
      {"holds no adapter_config.json"});
}

}  // namespace
}  // namespace shardtrain::models
