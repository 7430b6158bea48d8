// The families' recipes (models/recipe.h) without a process group: the zoo's table, each task's data and losses,
// T5's span corruption against hand-worked rows, every FLOPs formula against a count of the built model's weight
// matrices, FLAVA's evaluation.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "models/entities.h"
#include "models/t5/t5_span_corruption.h"
#include "shardtrain/data/pipeline/synth.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/models/bert.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/losses.h"
#include "shardtrain/models/synthetic_batch.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"
#include "shardtrain/models/zoo.h"
#include "support/expect_error.h"

namespace shardtrain::models {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Recipes, EveryFlavorHasARecipeOfItsFamily) {
  for (const auto& f : list_flavors()) {
    SCOPED_TRACE(f.flavor);
    const auto recipe = recipe_of(f.flavor);
    EXPECT_EQ(recipe->family(), f.family);
    EXPECT_EQ(recipe->flavor(), f.flavor);
    EXPECT_FALSE(recipe->tasks().empty());
  }
  const std::string unknown = error_of([] { recipe_of("bert-bass-uncased"); });
  EXPECT_NE(unknown.find("unknown model flavor 'bert-bass-uncased' (did you mean 'bert-base-uncased'"),
            std::string::npos) << unknown;
}

// Every flavor's transformers config.json (what `checkpoint export --hf` writes) reads back, through the family's
// from-config.json reading (what model.from uses), into the same model: the same config.json again, the same
// parameters by name and shape. The published flavors' sizes differ from the families' defaults, and every real
// number is moved off its value first, so a key written under a name the reading does not look at shows here.
TEST(Recipes, HfConfigJsonReadsBackToTheSameModel) {
  const std::string dir = "/tmp/shardtrain_recipes_test_" + std::to_string(::getpid());
  io::make_directories(dir);
  for (const auto& f : list_flavors()) {
    SCOPED_TRACE(f.flavor);
    const auto recipe = recipe_of(f.flavor);
    // Every real number moved off its value (epsilons, dropout, RoPE's theta, loss weights): one the reading does
    // not look at comes back as the family's default.
    nlohmann::json moved = nlohmann::json::parse(recipe->hf_config_json());
    std::function<void(nlohmann::json&)> move = [&](nlohmann::json& j) {
      for (auto& v : j) {
        if (v.is_number_float()) v = v.get<double>() * 1.5 + 1e-3;
        if (v.is_structured()) move(v);
      }
    };
    move(moved);
    const std::string json = moved.dump(2);
    io::write_file_atomic(dir + "/config.json", std::vector<char>(json.begin(), json.end()));
    const auto back = recipe_from_hf_config(dir);
    EXPECT_EQ(back->family(), f.family);
    EXPECT_EQ(back->hf_config_json(), json);
    const auto a = recipe->build(meta_build())->named_parameters(), b = back->build(meta_build())->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& p : a) {
      ASSERT_TRUE(b.contains(p.key())) << p.key();
      EXPECT_EQ(p.value().sizes(), b[p.key()].sizes()) << p.key();
    }
  }
  io::remove_tree(dir);
}

// Llama's RoPE scaling from either transformers' config.json: 4's rope_scaling beside rope_theta (the published
// Llama 3.1/3.2 files) and 5's rope_parameters holding both; what it does not implement is refused by name.
TEST(Recipes, LlamaRopeScalingFromEitherTransformersFormat) {
  const std::string dir = "/tmp/shardtrain_recipes_rope_" + std::to_string(::getpid());
  io::make_directories(dir);
  auto config_of = [&](nlohmann::json j) {
    const std::string text = j.dump(2);
    io::write_file_atomic(dir + "/config.json", std::vector<char>(text.begin(), text.end()));
    const auto model = recipe_from_hf_config(dir)->build(meta_build());
    return dynamic_cast<LlamaImpl&>(*model).config;
  };
  nlohmann::json base = {{"model_type", "llama"}, {"vocab_size", 100}, {"hidden_size", 64},
                         {"intermediate_size", 32},  {"num_hidden_layers", 1}, {"num_attention_heads", 4},
                         {"num_key_value_heads", 2}, {"max_position_embeddings", 256}};
  const nlohmann::json scaling = {{"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 64}};
  nlohmann::json v4 = base, v5 = base;
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = scaling;
  v4["rope_scaling"]["rope_type"] = "llama3";
  v5["rope_parameters"] = scaling;
  v5["rope_parameters"]["rope_type"] = "llama3";
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  const LlamaConfig a = config_of(v4), b = config_of(v5);
  for (const LlamaConfig& c : {a, b}) {
    EXPECT_EQ(c.rope_scaling.type, "llama3");
    EXPECT_EQ(c.rope_scaling.factor, 32.0);
    EXPECT_EQ(c.rope_scaling.original_max_positions, 64);
    EXPECT_EQ(c.rope_theta, 500000.0);
  }
  EXPECT_TRUE(at::equal(llama_inv_freq(a, at::kCPU), llama_inv_freq(b, at::kCPU)));
  // The slowest frequency is divided by the factor, the fastest kept.
  const at::Tensor plain = rotary_inv_freq(16, 500000.0, at::kCPU), scaled = llama_inv_freq(a, at::kCPU);
  EXPECT_FLOAT_EQ(scaled[7].item<float>(), plain[7].item<float>() / 32);
  EXPECT_FLOAT_EQ(scaled[0].item<float>(), plain[0].item<float>());
  nlohmann::json linear = base;  // no rope_theta: transformers' default, 10000
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older key for the type
  EXPECT_TRUE(at::allclose(llama_inv_freq(config_of(linear), at::kCPU), rotary_inv_freq(16, 10000.0, at::kCPU) / 2));

  nlohmann::json yarn = base;
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  testing::expect_error<std::invalid_argument>([&] { config_of(yarn); },
                                               {"'rope_type' is \"yarn\"", "implements 'default', 'linear', 'llama3'"});
  nlohmann::json no_factor = base;
  no_factor["rope_scaling"] = {{"rope_type", "linear"}};
  testing::expect_error<std::invalid_argument>([&] { config_of(no_factor); }, {"'factor' is absent", "at least 1"});
  nlohmann::json odd = base;
  odd["head_dim"] = 15;
  testing::expect_error<std::invalid_argument>([&] { config_of(odd); }, {"'head_dim' is 15", "even"});
  io::remove_tree(dir);
}

// A BertForMaskedLM saved by transformers has no pooler, one converted from the original BERT has: the weights
// beside the config.json decide, and either loads.
TEST(Recipes, BertPoolerAsTheWeightsHaveIt) {
  const std::string dir = "/tmp/shardtrain_recipes_pooler_" + std::to_string(::getpid());
  io::make_directories(dir);
  const std::string json = recipe_of("bert-debug")->hf_config_json();
  EXPECT_NE(json.find("BertForMaskedLM"), std::string::npos);
  io::write_file_atomic(dir + "/config.json", std::vector<char>(json.begin(), json.end()));
  EXPECT_TRUE(recipe_from_hf_config(dir)->build(meta_build())->named_parameters().contains("pooler.weight"));
  ZooModel source = build_model("bert-debug");
  std::vector<std::pair<std::string, at::Tensor>> without_pooler;
  for (const auto& t : hf_named_tensors(*source.module, source.names)) {
    if (t.first.find("pooler") == std::string::npos) without_pooler.push_back(t);
  }
  io::write_safetensors(dir + "/model.safetensors", without_pooler);
  ZooModel loaded = build_model(recipe_from_hf_config(dir));
  EXPECT_FALSE(loaded.module->named_parameters().contains("pooler.weight"));
  EXPECT_NO_THROW(load_weights(*loaded.module, dir, loaded.names));
  io::remove_tree(dir);
}

// A task's head: BERT's classify puts a classifier over data.labels on the pooler in place of the masked-LM head,
// and back; the config.json of each says so; loading weights of one into the other initializes the missing head
// and leaves the other unused, and says which.
TEST(Recipes, TaskHeadsMoveBetweenMaskedLmAndClassifier) {
  const auto base = recipe_of("bert-debug");
  EXPECT_EQ(base->tasks().front(), "masked_lm");
  EXPECT_EQ(recipe_for_task(base, "", {}), base);
  EXPECT_EQ(recipe_for_task(base, "masked_lm", {}), base);
  EXPECT_NE(error_of([&] { recipe_for_task(base, "classify", {}); }).find("data.labels names none"), std::string::npos);
  EXPECT_NE(error_of([&] { recipe_for_task(base, "clasify", {}); }).find("did you mean 'classify'"), std::string::npos);

  const auto classifier = recipe_for_task(base, "classify",
                                          {{"negative", "positive"}, false, std::nullopt, std::nullopt});
  auto params = classifier->build(meta_build())->named_parameters();
  EXPECT_EQ(params["classifier.weight"].sizes(), at::IntArrayRef({2, 32}));
  EXPECT_TRUE(params.contains("pooler.weight"));
  EXPECT_FALSE(params.contains("mlm_bias"));
  EXPECT_EQ(classifier->tasks().front(), "classify");
  EXPECT_EQ(classifier->task()->data_needs().class_names, (std::vector<std::string>{"negative", "positive"}));
  EXPECT_GT(classifier->activation_bytes({}).outside_layers, 0);

  const std::string dir = "/tmp/shardtrain_recipes_heads_" + std::to_string(::getpid());
  io::make_directories(dir);
  const std::string json = classifier->hf_config_json();
  EXPECT_NE(json.find("BertForSequenceClassification"), std::string::npos);
  io::write_file_atomic(dir + "/config.json", std::vector<char>(json.begin(), json.end()));
  const auto read = recipe_from_hf_config(dir);
  EXPECT_EQ(read->hf_config_json(), json);
  EXPECT_EQ(read->task()->name(), "classify");
  EXPECT_TRUE(recipe_for_task(read, "masked_lm", {})->build(meta_build())->named_parameters().contains("mlm_bias"));

  // The masked-LM model's weights into the classifier, and the classifier's back into a masked-LM model.
  ZooModel mlm = build_model("bert-debug"), cls = build_model(classifier);
  save_weights(*mlm.module, dir + "/mlm.safetensors", mlm.names);
  LoadReport report = load_weights(*cls.module, dir + "/mlm.safetensors", cls.names);
  EXPECT_EQ(report.initialized, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  EXPECT_EQ(report.unused.size(), 5u);  // cls.predictions: bias, transform dense and LayerNorm weights and biases
  for (const auto& name : report.unused) EXPECT_EQ(name.rfind("cls.predictions.", 0), 0u) << name;
  save_weights(*cls.module, dir + "/cls.safetensors", cls.names);
  report = load_weights(*mlm.module, dir + "/cls.safetensors", mlm.names);
  EXPECT_EQ(report.initialized.size(), 5u);
  EXPECT_EQ(report.unused, (std::vector<std::string>{"classifier.bias", "classifier.weight"}));

  // multi-label: problem_type multi_label_classification in the config, and read back; the model's own classes
  // keep the flag, a set of one class is refused
  const auto multi = recipe_for_task(base, "classify", {{"a", "b", "c"}, true, std::nullopt, std::nullopt});
  EXPECT_TRUE(multi->task()->data_needs().multi_label);
  const std::string multi_json = multi->hf_config_json();
  EXPECT_NE(multi_json.find("\"problem_type\": \"multi_label_classification\""), std::string::npos) << multi_json;
  io::write_file_atomic(dir + "/config.json", std::vector<char>(multi_json.begin(), multi_json.end()));
  const auto multi_read = recipe_from_hf_config(dir);
  EXPECT_EQ(multi_read->hf_config_json(), multi_json);
  EXPECT_TRUE(recipe_for_task(multi_read, "classify", {})->task()->data_needs().multi_label);
  EXPECT_FALSE(classifier->task()->data_needs().multi_label);
  EXPECT_NE(error_of([&] { recipe_for_task(base, "classify", {{"only"}, true, std::nullopt, std::nullopt}); })
                .find("sets of classes need 2 classes or more"), std::string::npos);

  const std::string gaps = R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"],
                               "id2label": {"0": "a", "2": "b"}})";
  io::write_file_atomic(dir + "/config.json", std::vector<char>(gaps.begin(), gaps.end()));
  EXPECT_NE(error_of([&] { recipe_from_hf_config(dir); }).find("'id2label' is"), std::string::npos);
  io::remove_tree(dir);
}

// A causal LM as a sequence classifier (LlamaForSequenceClassification, GPT2ForSequenceClassification; Qwen2's with
// its head tied): score in place of the LM head (nothing tied: a Llama's embedding becomes a unit of its own, read
// at one end only); the config.json says so, with the classes and the padding id, and reads back; the LM's weights
// load into it, score initialized and said so; each row's last token is scored (a right-padded row as it alone);
// the loss is classifier_loss's; it moves back to causal_lm, and does not generate.
TEST(Recipes, CausalLmsClassifyByTheirLastToken) {
  for (const std::string flavor : {"llama-debug", "qwen2-debug", "gpt2-debug"}) {
    SCOPED_TRACE(flavor);
    const bool gpt2 = flavor == "gpt2-debug";
    const auto base = recipe_of(flavor);
    EXPECT_EQ(base->tasks(), (std::vector<std::string>{"causal_lm", "classify"}));
    EXPECT_NE(error_of([&] { recipe_for_task(base, "classify", {}); }).find("data.labels names none"),
              std::string::npos);
    const auto classifier =
        recipe_for_task(base, "classify", {{"negative", "neutral", "positive"}, false, std::nullopt, 0});
    EXPECT_EQ(classifier->tasks().front(), "classify");
    EXPECT_EQ(classifier->task()->data_needs().num_labels, 3);
    EXPECT_EQ(classifier->edge_unit_classes().input, gpt2 ? "" : "LlamaEmbedding");
    EXPECT_EQ(classifier->edge_unit_classes().output, "");
    EXPECT_TRUE(classifier->tied_tables().empty());
    EXPECT_GT(classifier->activation_bytes({}).outside_layers, 0);
    EXPECT_LT(classifier->activation_bytes({}).loss_transient, base->activation_bytes({}).loss_transient);
    ZooModel model = build_model(classifier);
    auto params = model.module->named_parameters();
    EXPECT_EQ(params["score.weight"].sizes(), at::IntArrayRef({3, 64}));
    EXPECT_FALSE(params.contains("lm_head.weight"));
    EXPECT_NE(error_of([&] { classifier->text_decoder(*model.module); }).find("ForSequenceClassification): it does "
                                                                              "not generate text"),
              std::string::npos);

    const std::string dir = "/tmp/shardtrain_recipes_lm_classifier_" + std::to_string(::getpid());
    io::make_directories(dir);
    const std::string json = classifier->hf_config_json();
    for (const char* key : {"ForSequenceClassification\"", "\"2\": \"positive\"", "\"pad_token_id\": 0"}) {
      EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
    }
    io::write_file_atomic(dir + "/config.json", std::vector<char>(json.begin(), json.end()));
    const auto read = recipe_from_hf_config(dir);
    EXPECT_EQ(read->hf_config_json(), json);
    EXPECT_EQ(read->task()->name(), "classify");
    const auto back = recipe_for_task(read, "causal_lm", {});
    EXPECT_EQ(back->task()->name(), "causal_lm");
    EXPECT_FALSE(back->build(meta_build())->named_parameters().contains("score.weight"));
    EXPECT_NE(error_of([&] { read->task("causal_lm"); }).find("is a sequence classifier, without an LM head"),
              std::string::npos);

    ZooModel lm = build_model(flavor);
    save_weights(*lm.module, dir + "/lm.safetensors", lm.names);
    const LoadReport report = load_weights(*model.module, dir + "/lm.safetensors", model.names);
    EXPECT_EQ(report.initialized, (std::vector<std::string>{"score.weight"}));
    // An untied LM's head is left unused and said so (a tied one's file has none).
    const bool untied_head = lm.module->named_parameters().contains("lm_head.weight");
    EXPECT_EQ(report.unused, untied_head ? std::vector<std::string>{"lm_head.weight"} : std::vector<std::string>{});
    EXPECT_TRUE(at::equal(model.module->named_parameters()["embed.weight"],
                          lm.module->named_parameters()["embed.weight"]));
    io::remove_tree(dir);

    model.module->eval();
    auto run = [&](const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& labels) {
      if (gpt2) {
        const Gpt2Outputs o = dynamic_cast<Gpt2Impl&>(*model.module).run(ids, mask, labels);
        return std::pair(o.logits, o.loss);
      }
      const LlamaOutputs o = dynamic_cast<LlamaImpl&>(*model.module).run(ids, mask, labels);
      return std::pair(o.logits, o.loss);
    };
    torch::manual_seed(3);
    const at::Tensor ids = torch::randint(3, 1000, {2, 7}, torch::kLong);
    at::Tensor mask = at::ones_like(ids);
    mask[1].narrow(0, 4, 3).zero_();  // row 1: 4 tokens, then padding
    const at::Tensor labels = torch::tensor({2, 0}, torch::kLong);
    const auto [logits, loss] = run(ids, mask, labels);
    ASSERT_EQ(logits.sizes(), at::IntArrayRef({2, 3}));
    EXPECT_TRUE(at::allclose(loss, classifier_loss(logits, labels)));
    const at::Tensor alone0 = run(ids.narrow(0, 0, 1), {}, {}).first[0];
    const at::Tensor alone1 = run(ids.narrow(0, 1, 1).narrow(1, 0, 4), {}, {}).first[0];
    EXPECT_TRUE(at::allclose(logits[0], alone0, 1e-5, 1e-6)) << logits[0] << alone0;
    EXPECT_TRUE(at::allclose(logits[1], alone1, 1e-5, 1e-6)) << logits[1] << alone1;
  }
}

// token_classify: a classifier of every token on the last layer's output, no pooler (BertForTokenClassification's
// layout), the config.json says so and reads back; the pooler of masked-LM weights is left unused; its loss is the
// mean cross-entropy over the tokens whose label is not -100; a model with a token classifier moves to classify.
TEST(Recipes, TokenClassifierHead) {
  const auto base = recipe_of("bert-debug");
  const auto tagger = recipe_for_task(base, "token_classify",
                                      {{"O", "B-PER", "I-PER"}, false, std::nullopt, std::nullopt});
  auto params = tagger->build(meta_build())->named_parameters();
  EXPECT_EQ(params["classifier.weight"].sizes(), at::IntArrayRef({3, 32}));
  EXPECT_FALSE(params.contains("pooler.weight"));
  EXPECT_FALSE(params.contains("mlm_bias"));
  EXPECT_EQ(tagger->tasks().front(), "token_classify");
  EXPECT_TRUE(tagger->task()->data_needs().word_labels);
  EXPECT_GT(tagger->activation_bytes({}).loss_transient, 0);
  EXPECT_NE(error_of([&] { recipe_for_task(base, "token_classify", {}); }).find("data.labels: [O, B-PER, I-PER]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { recipe_for_task(base, "token_classify", {{"O", "B-X"}, true, std::nullopt, std::nullopt}); })
                .find("a token classifier gives each word one class"), std::string::npos);

  const std::string dir = "/tmp/shardtrain_recipes_tagger_" + std::to_string(::getpid());
  io::make_directories(dir);
  const std::string json = tagger->hf_config_json();
  EXPECT_NE(json.find("BertForTokenClassification"), std::string::npos);
  io::write_file_atomic(dir + "/config.json", std::vector<char>(json.begin(), json.end()));
  const auto read = recipe_from_hf_config(dir);
  EXPECT_EQ(read->hf_config_json(), json);
  EXPECT_EQ(read->task()->name(), "token_classify");
  EXPECT_TRUE(recipe_for_task(read, "classify", {})->build(meta_build())->named_parameters().contains("pooler.weight"));

  ZooModel mlm = build_model("bert-debug"), tags = build_model(tagger);
  save_weights(*mlm.module, dir + "/mlm.safetensors", mlm.names);
  const LoadReport report = load_weights(*tags.module, dir + "/mlm.safetensors", tags.names);
  EXPECT_EQ(report.initialized, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  EXPECT_NE(std::find(report.unused.begin(), report.unused.end(), "bert.pooler.dense.weight"), report.unused.end());
  io::remove_tree(dir);

  // the loss: only the labelled tokens count
  tags.module->eval();
  const at::Tensor ids = at::randint(5, 100, {2, 6}, at::kLong);
  const at::Tensor labels = at::tensor({-100, 1, 2, -100, 0, -100, -100, 0, -100, 1, 1, -100}, at::kLong).view({2, 6});
  auto& bert = *std::dynamic_pointer_cast<BertImpl>(tags.module);
  const BertOutputs out = bert.run(ids, {}, {}, labels);
  EXPECT_EQ(out.logits.sizes(), at::IntArrayRef({2, 6, 3}));
  const at::Tensor keep = labels.flatten() != -100;
  const at::Tensor expected =
      at::cross_entropy_loss(out.logits.flatten(0, 1).index({keep}), labels.flatten().index({keep}));
  EXPECT_NEAR(out.loss.item<double>(), expected.item<double>(), 1e-6);
}

// Entities as seqeval finds them (get_entities, its default mode), and the counts its overall precision and recall
// come from: the cases below as seqeval 1.2.2 answers them.
TEST(ClassifierEvaluation, EntitiesAsSeqevalFindsThem) {
  using E = std::vector<Entity>;
  EXPECT_EQ(entities_of({"B-PER", "I-PER", "O", "B-LOC"}), (E{{"PER", 0, 1}, {"LOC", 3, 3}}));
  EXPECT_EQ(entities_of({"I-PER", "I-PER", "B-PER"}), (E{{"PER", 0, 1}, {"PER", 2, 2}}));
  EXPECT_EQ(entities_of({"B-PER", "I-LOC", "O"}), (E{{"PER", 0, 0}, {"LOC", 1, 1}}));
  EXPECT_EQ(entities_of({"O", "E-PER", "S-LOC", "B-ORG", "E-ORG"}), (E{{"PER", 1, 1}, {"LOC", 2, 2}, {"ORG", 3, 4}}));
  EXPECT_EQ(entities_of({"B", "I", "O", "PER"}), (E{{"_", 0, 1}, {"ER", 3, 3}}));
  EXPECT_EQ(entities_of({"B-PER", "I-PER", "I-PER"}), (E{{"PER", 0, 2}}));
  EXPECT_TRUE(entities_of({}).empty());
  EntityCounts counts;  // seqeval: precision 0.75, recall 1.0
  counts.add({"B-PER", "I-PER", "O", "B-LOC"}, {"B-PER", "I-PER", "O", "I-LOC"});
  counts.add({"I-ORG", "O"}, {"B-ORG", "B-ORG"});
  EXPECT_EQ(counts.true_entities, 3);
  EXPECT_EQ(counts.predicted, 4);
  EXPECT_EQ(counts.correct, 3);
}

// model.overrides: a flavor's config.json with the named keys changed, read back as any config.json is.
TEST(Recipes, OverridesMakeCustomSizes) {
  const auto bert = recipe_of_model("bert-base-uncased", {{"layers", 2}, {"dim", 128}, {"heads", 2}, {"mlp_dim", 256}});
  EXPECT_EQ(bert->flavor(), "bert-base-uncased {dim: 128, heads: 2, layers: 2, mlp_dim: 256}");
  auto params = bert->build(meta_build())->named_parameters();
  EXPECT_EQ(params["layers.1.mlp.fc1.weight"].sizes(), at::IntArrayRef({256, 128}));
  EXPECT_FALSE(params.contains("layers.2.mlp.fc1.weight"));
  // FLAVA's width is every encoder's and the projections'; unimodal_layers the text and the image encoder's.
  const auto flava = recipe_of_model("flava-debug", {{"dim", 48}, {"unimodal_layers", 3}});
  params = flava->build(meta_build())->named_parameters();
  EXPECT_TRUE(params.contains("text.layers.2.mlp.fc1.weight"));
  EXPECT_TRUE(params.contains("image.layers.2.mlp.fc1.weight"));
  EXPECT_EQ(params["multimodal.layers.0.mlp.fc1.weight"].sizes()[1], 48);
  // Llama's head size follows the width (no head_dim is written).
  const auto llama = recipe_of_model("llama-debug", {{"dim", 128}, {"rope_theta", 1e6}});
  EXPECT_NE(llama->hf_config_json().find("\"rope_theta\": 1000000.0"), std::string::npos);
  EXPECT_EQ(recipe_of_model("t5-small", {})->flavor(), "t5-small");
  // Keys the config.json leaves out: a head size apart from the width, Mistral's window where v0.3 has none.
  const auto wide = recipe_of_model("llama-debug", {{"head_dim", 32}})->build(meta_build());
  EXPECT_EQ(dynamic_cast<LlamaImpl&>(*wide).config.head_size(), 32);
  EXPECT_EQ(wide->named_parameters()["layers.0.attn.q.weight"].sizes(), at::IntArrayRef({4 * 32, 64}));
  const auto windowed =
      recipe_of_model("mistral-7b-v0.3", {{"layers", 1}, {"sliding_window", 1024}})->build(meta_build());
  EXPECT_EQ(dynamic_cast<LlamaImpl&>(*windowed).config.sliding_window, 1024);
  EXPECT_NE(error_of([] { recipe_of_model("llama-debug", {{"sliding_window", 8}}); }).find("'sliding_window' is not"),
            std::string::npos);

  EXPECT_NE(error_of([] { recipe_of_model("bert-debug", {{"layer", 3}}); })
                .find("'layer' is not a dimension of a bert model (did you mean 'layers'? bert's: layers, dim"),
            std::string::npos);
  EXPECT_NE(error_of([] { recipe_of_model("bert-debug", {{"layers", 2.5}}); })
                .find("model.overrides: layers is 2.5 (expected a whole number)"),
            std::string::npos);
}

// Weights into a model resized by model.overrides (LoadOptions::partial), as transformers' from_pretrained with a
// changed config: the layers both have are loaded, the file's extra ones are left and the model's extra ones keep
// their initialization, each reported; strict loading refuses both, and a changed width fails either way unless
// ignore_mismatched_sizes.
TEST(Recipes, PartialLoadIntoAResizedModel) {
  const std::string dir = "/tmp/shardtrain_recipes_partial_" + std::to_string(::getpid());
  io::make_directories(dir);
  ZooModel three = build_model(recipe_of_model("bert-debug", {{"layers", 3}}));
  save_weights(*three.module, dir + "/three.safetensors", three.names);
  auto params_of = [](const ZooModel& m) { return m.module->named_parameters(); };
  const LoadOptions partial{.partial = true};

  ZooModel two = build_model(recipe_of_model("bert-debug", {{"layers", 2}}));
  const std::string strict = error_of([&] { load_weights(*two.module, dir + "/three.safetensors", two.names); });
  EXPECT_NE(strict.find("tensor 'bert.encoder.layer.2."), std::string::npos) << strict;
  EXPECT_NE(strict.find("in the file matches nothing in the model"), std::string::npos) << strict;
  LoadReport report = load_weights(*two.module, dir + "/three.safetensors", two.names, partial);
  EXPECT_TRUE(report.initialized.empty());
  EXPECT_EQ(report.unused.size(), 16u);  // layer 2: q, k, v, o, fc1, fc2, two LayerNorms, weights and biases
  for (const auto& name : report.unused) EXPECT_EQ(name.rfind("bert.encoder.layer.2.", 0), 0u) << name;
  for (const auto& p : params_of(two)) EXPECT_TRUE(at::equal(p.value(), params_of(three)[p.key()])) << p.key();

  ZooModel four = build_model(recipe_of_model("bert-debug", {{"layers", 4}}));
  const at::Tensor before = params_of(four)["layers.3.mlp.fc1.weight"].clone();
  EXPECT_NE(error_of([&] { load_weights(*four.module, dir + "/three.safetensors", four.names); })
                .find("of the model is missing from the file"),
            std::string::npos);
  report = load_weights(*four.module, dir + "/three.safetensors", four.names, partial);
  EXPECT_TRUE(report.unused.empty());
  EXPECT_EQ(report.initialized.size(), 16u);
  for (const auto& name : report.initialized) EXPECT_EQ(name.rfind("bert.encoder.layer.3.", 0), 0u) << name;
  EXPECT_TRUE(at::equal(params_of(four)["layers.3.mlp.fc1.weight"], before));
  EXPECT_TRUE(at::equal(params_of(four)["layers.2.mlp.fc1.weight"], params_of(three)["layers.2.mlp.fc1.weight"]));

  ZooModel wider = build_model(recipe_of_model("bert-debug", {{"layers", 3}, {"mlp_dim", 80}}));
  const std::string refused =
      error_of([&] { load_weights(*wider.module, dir + "/three.safetensors", wider.names, partial); });
  EXPECT_NE(refused.find("the model expects [80, 32]"), std::string::npos) << refused;
  EXPECT_NE(refused.find("model.ignore_mismatched_sizes"), std::string::npos) << refused;  // the way out
  // ignore_mismatched_sizes (transformers' flag): those keep their initialization, the rest loads.
  const at::Tensor fc1 = params_of(wider)["layers.0.mlp.fc1.weight"].clone();
  report = load_weights(*wider.module, dir + "/three.safetensors", wider.names, {.ignore_mismatched_sizes = true});
  EXPECT_EQ(report.mismatched.size(), 9u);  // per layer: fc1's weight and bias, fc2's weight
  EXPECT_EQ(report.mismatched[0], "bert.encoder.layer.0.intermediate.dense.weight: [64, 32] -> [80, 32]");
  EXPECT_TRUE(report.initialized.empty() && report.unused.empty());
  EXPECT_TRUE(at::equal(params_of(wider)["layers.0.mlp.fc1.weight"], fc1));
  EXPECT_TRUE(at::equal(params_of(wider)["layers.0.attn.q.weight"], params_of(three)["layers.0.attn.q.weight"]));
  EXPECT_TRUE(at::equal(params_of(wider)["layers.2.mlp.fc2.bias"], params_of(three)["layers.2.mlp.fc2.bias"]));
  io::remove_tree(dir);
}

TEST(Recipes, DebugFlavorsTrainOnTheirTasks) {
  struct Case {
    std::string flavor, task;
    std::vector<std::string> losses;
    std::array<bool, 3> kinds;
  };
  const std::vector<std::string> flava_losses = {"mim", "mlm", "itm", "contrastive", "mmm_image", "mmm_text"};
  for (const Case& c : {Case{"flava-debug", "pretraining", flava_losses, {true, true, true}},
                        Case{"bert-debug", "masked_lm", {"mlm"}, {false, true, false}},
                        Case{"vit-debug", "image_classification", {"cls"}, {false, false, true}},
                        Case{"t5-debug", "span_corruption", {"span"}, {false, true, false}},
                        Case{"llama-debug", "causal_lm", {"lm"}, {false, true, false}},
                        Case{"gpt2-debug", "causal_lm", {"lm"}, {false, true, false}}}) {
    SCOPED_TRACE(c.flavor);
    const auto recipe = recipe_of(c.flavor);
    const auto task = recipe->task();
    EXPECT_EQ(task->name(), c.task);
    EXPECT_EQ(recipe->task(c.task)->name(), c.task);
    EXPECT_EQ(task->loss_names(), c.losses);
    EXPECT_EQ(task->data_needs().kinds, c.kinds);
    EXPECT_EQ(task->has_evaluation(), c.flavor != "bert-debug" && c.flavor != "t5-debug");
    // FLAVA's batch kinds each leave heads out; BERT's pooler takes no part in the MLM loss.
    EXPECT_EQ(task->leaves_parameters_unused(), c.flavor == "flava-debug" || c.flavor == "bert-debug");
    const std::string bad = error_of([&] { recipe->task("pretrainin"); });
    EXPECT_NE(bad.find("model.task: 'pretrainin' is not a task of " + recipe->family()), std::string::npos) << bad;
    EXPECT_NE(bad.find(c.task), std::string::npos) << bad;
  }
  // A BertModel without a masked-LM head cannot train on masked_lm; a ViT encoder without classifier on labels.
  EXPECT_NE(error_of([] { recipe_of("bert-base-uncased")->task(); }).find("without a masked-LM head"),
            std::string::npos);
  EXPECT_NE(error_of([] { recipe_of("vit-huge-patch14-224")->task(); }).find("no classifier"), std::string::npos);
}

// --- T5 span corruption ----------------------------------------------------------------------------------------

std::vector<int64_t> iota_tokens(int64_t n) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = 100 + i;
  return t;
}

TEST(SpanCorruption, ShortRows) {
  std::mt19937_64 rng(1);
  // n = 0: nothing to hide. n = 1: round(0.15) = 0 tokens hidden.
  EXPECT_EQ(span_corrupt({}, 999, 2, rng), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{2}, {2}}));
  EXPECT_EQ(span_corrupt({7}, 999, 2, rng), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{7, 2}, {2}}));
  // n = 2: at least one token hidden, one span of length 1 starting at rng() % 2.
  std::mt19937_64 copy(rng);
  const int64_t start = static_cast<int64_t>(copy() % 2);
  const auto [input, target] = span_corrupt({7, 8}, 999, 2, rng);
  EXPECT_EQ(input, start == 0 ? std::vector<int64_t>({999, 8, 2}) : std::vector<int64_t>({7, 999, 2}));
  EXPECT_EQ(target, start == 0 ? std::vector<int64_t>({999, 7, 2}) : std::vector<int64_t>({999, 8, 2}));
}

TEST(SpanCorruption, OneSpanOfThree) {
  // n = 20: round(0.15 * 20) = 3 tokens in round(3 / 3) = 1 span, starting at rng() % (20 - 3 + 1).
  std::mt19937_64 rng(42), copy(42);
  const int64_t s = static_cast<int64_t>(copy() % 18);
  const auto tokens = iota_tokens(20);
  const auto [input, target] = span_corrupt(tokens, 999, 1, rng);
  std::vector<int64_t> expected_input(tokens.begin(), tokens.begin() + s);
  expected_input.push_back(999);
  expected_input.insert(expected_input.end(), tokens.begin() + s + 3, tokens.end());
  expected_input.push_back(1);
  EXPECT_EQ(input, expected_input);
  EXPECT_EQ(target, (std::vector<int64_t>{999, 100 + s, 101 + s, 102 + s, 1}));
}

TEST(SpanCorruption, TwoSpansTakeSentinelsInOrderOfPosition) {
  // n = 40: round(6) = 6 tokens in round(2) = 2 spans of 3, starts rng() % 38 each. Seed 3 draws two spans that
  // neither overlap nor touch (checked below), so the input has two sentinels, numbered from the left.
  std::mt19937_64 rng(3), copy(3);
  const int64_t a = static_cast<int64_t>(copy() % 38), b = static_cast<int64_t>(copy() % 38);
  const int64_t first = std::min(a, b), second = std::max(a, b);
  ASSERT_GT(second, first + 3) << "seed 3 no longer draws separate spans: pick another";
  const auto tokens = iota_tokens(40);
  const auto [input, target] = span_corrupt(tokens, 999, 1, rng);
  ASSERT_EQ(input.size(), 40u - 6u + 2u + 1u);
  EXPECT_EQ(input[static_cast<size_t>(first)], 999);
  EXPECT_EQ(input[static_cast<size_t>(second - 3 + 1)], 998);
  EXPECT_EQ(target, (std::vector<int64_t>{999, 100 + first, 101 + first, 102 + first, 998, 100 + second, 101 + second,
                                          102 + second, 1}));
}

// --- FLOPs ----------------------------------------------------------------------------------------------------

// Multiply-adds per token of the weight matrices (2-D parameters) of every module of class `layer_class` whose
// name starts with `prefix`, from the model built on the meta device.
double layer_weights(const ModelRecipe& recipe, const std::string& prefix) {
  BuildOptions meta;
  meta.tensors = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kMeta);
  const auto module = recipe.build(meta);
  double total = 0;
  for (const auto& item : module->named_modules()) {
    if (fsdp::module_class_name(*item.value()) != recipe.layer_class() || item.key().rfind(prefix, 0) != 0) continue;
    for (const auto& p : item.value()->parameters()) total += p.dim() == 2 ? static_cast<double>(p.numel()) : 0;
  }
  return total;
}

data::Batch text_batch(int64_t rows, int64_t tokens) {
  data::Batch b;
  b.kind = data::SampleKind::TEXT;
  b.input_ids = at::zeros({rows, tokens}, at::kLong);
  return b;
}

data::Batch image_batch(int64_t rows, int64_t size) {
  data::Batch b;
  b.kind = data::SampleKind::IMAGE;
  b.pixels = at::zeros({rows, 3, size, size});
  return b;
}

// The 6N rule for the weights plus attention's 12 L T^2 width per sample: the formulas, checked against the weights
// the built model really has (grouped-query attention, T5's cross-attention, FLAVA's three encoders).
TEST(TrainingFlops, EqualSixTimesTheLayersWeightsPlusAttention) {
  const double B = 3, T = 16;
  {
    const auto r = recipe_of("bert-debug");
    const auto c = bert_flavor("bert-debug");
    const double expected = 6 * layer_weights(*r, "") * T * B + 12.0 * c.layers * T * T * c.dim * B;
    EXPECT_DOUBLE_EQ(r->training_flops(text_batch(3, 16)), expected);
  }
  {
    const auto r = recipe_of("llama-debug");
    const auto c = llama_flavor("llama-debug");
    ASSERT_LT(c.kv_heads, c.heads);  // grouped-query attention: k and v narrower than q
    const double expected = 6 * layer_weights(*r, "") * T * B + 12.0 * c.layers * T * T * c.dim * B;
    EXPECT_DOUBLE_EQ(r->training_flops(text_batch(3, 16)), expected);
  }
  {
    // GPT-2: c_attn (d x 3d) and c_proj, stored (in, out) (Conv1D), count as q, k, v and o.
    const auto r = recipe_of("gpt2-debug");
    const auto c = gpt2_flavor("gpt2-debug");
    const double expected = 6 * layer_weights(*r, "") * T * B + 12.0 * c.layers * T * T * c.dim * B;
    EXPECT_DOUBLE_EQ(r->training_flops(text_batch(3, 16)), expected);
  }
  {
    const auto r = recipe_of("vit-debug");
    const auto c = vit_flavor("vit-debug");
    const double n = (c.image_size / c.patch_size) * (c.image_size / c.patch_size) + 1, L = c.layers, d = c.dim;
    // The last layer runs for the CLS token only (cls_only), its keys and values (2 d^2 weights) for all n.
    const double w = layer_weights(*r, "") / L, kv = 2 * d * d;
    const double expected = 6 * w * (L - 1) * n * B + 12.0 * (L - 1) * n * n * d * B +
                            6 * (kv * n + (w - kv)) * B + 12.0 * n * d * B;
    EXPECT_DOUBLE_EQ(r->training_flops(image_batch(3, c.image_size)), expected);
    EXPECT_THROW(r->training_flops(text_batch(3, 16)), std::invalid_argument);
  }
  {
    const auto r = recipe_of("t5-debug");
    const auto c = t5_flavor("t5-debug");
    const double inner = static_cast<double>(c.heads * c.head_dim), L = static_cast<double>(c.layers);
    const double attn = 4.0 * c.dim * inner, mlp = 2.0 * c.dim * static_cast<double>(c.mlp_dim);
    EXPECT_DOUBLE_EQ(layer_weights(*r, "encoder"), L * (attn + mlp));
    EXPECT_DOUBLE_EQ(layer_weights(*r, "decoder"), L * (2 * attn + mlp));  // self- and cross-attention
    // Span corruption of 14 text tokens: 2 masked in 1 span, so the encoder reads 12 + 1 sentinel + EOS = 14
    // tokens and the decoder 1 sentinel + 2 + EOS = 4.
    const double enc = 14, dec = 4;
    const double encoder = 2 * (attn + mlp) * enc + 4 * enc * enc * inner;
    const double decoder = 2 * (attn + mlp) * dec + 4 * dec * dec * inner + attn * (dec + enc) + 4 * dec * enc * inner;
    EXPECT_DOUBLE_EQ(r->training_flops(text_batch(3, 16)), 3 * L * (encoder + decoder) * B);
  }
  {
    const auto r = recipe_of("flava-debug");
    const auto c = flava_flavor("flava-debug");
    const double per_layer = layer_weights(*r, "text") / static_cast<double>(c.unimodal_layers);
    EXPECT_DOUBLE_EQ(layer_weights(*r, "multimodal"), per_layer * static_cast<double>(c.multimodal_layers));
    const double n = (c.image_size / c.patch_size) * (c.image_size / c.patch_size) + 1, U = c.unimodal_layers,
                 M = c.multimodal_layers, d = c.dim;
    auto layer = [&](double tokens) { return 2 * per_layer * tokens + 4 * tokens * tokens * d; };
    EXPECT_DOUBLE_EQ(r->training_flops(text_batch(3, 16)), 3 * U * layer(T) * B);
    EXPECT_DOUBLE_EQ(r->training_flops(image_batch(3, c.image_size)), 3 * U * layer(n) * B);
    data::Batch pair = text_batch(3, 16);
    pair.kind = data::SampleKind::IMAGE_TEXT;
    pair.pixels = at::zeros({3, 3, c.image_size, c.image_size});
    EXPECT_DOUBLE_EQ(r->training_flops(pair), 3 * (2 * U * (layer(T) + layer(n)) + M * layer(n + T + 1)) * B);
  }
}

// --- Batch sizes the objectives need ------------------------------------------------------------------------

TEST(Recipes, BatchTooSmallForAnObjectiveIsAnErrorNamingIt) {
  const auto flava = recipe_of("flava-debug")->task();
  testing::expect_error<std::invalid_argument>([&] { flava->check_batch_size(1, 4); },
                                               {"train.batch_size: 1 per rank", "ITM", "2 samples per rank"});
  const std::string alone = error_of([&] { flava->check_batch_size(1, 1); });
  EXPECT_NE(alone.find("contrastive loss"), std::string::npos) << alone;
  EXPECT_NO_THROW(flava->check_batch_size(2, 1));
  // Objectives whose samples stand alone train on one sample per rank.
  for (const char* flavor : {"bert-debug", "vit-debug", "t5-debug", "llama-debug", "gpt2-debug"}) {
    EXPECT_NO_THROW(recipe_of(flavor)->task()->check_batch_size(1, 1)) << flavor;
  }
}

// --- Evaluation -----------------------------------------------------------------------------------------------

TEST(FlavaEvaluation, UsesWholeBatchesAndLeavesTheModelTraining) {
  const std::string dir = "/tmp/shardtrain_recipes_eval_" + std::to_string(::getpid());
  io::remove_tree(dir);
  data::SynthOptions o;
  o.out = dir, o.image_text_samples = 4, o.text_samples = 2, o.image_samples = 2, o.eval_samples = 21;
  o.samples_per_shard = 32, o.image_size = 32;
  data::write_synth_dataset(o);

  const auto recipe = recipe_of("flava-debug");
  const auto task = recipe->task();
  const DataNeeds needs = task->data_needs();
  const auto source = std::make_shared<data::SampleSource>(std::vector<std::string>{dir + "/eval"},
                                                           data::SampleKind::IMAGE_TEXT);
  data::LoaderOptions lo;
  lo.batch_size = 4, lo.workers = 0, lo.itm_negative_probability = 0;
  lo.tokenizer = std::make_shared<data::WordPieceTokenizer>(data::load_vocab(dir + "/vocab.txt"), true);
  lo.text_length = 16, lo.image_size = needs.image_size, lo.patch_size = needs.patch_size;
  lo.codebook_size = needs.codebook_size;
  const data::Loader loader({source, nullptr, nullptr}, lo);
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::DistEnv{});  // a world of one
  ZooModel model = build_model(recipe);
  model.module->train();

  EvalInputs in;
  in.loader = &loader, in.source_size = source->size(), in.batch_size = 4, in.world = &pg.world();
  const auto all = task->evaluate(*model.module, in);
  EXPECT_EQ(all.at("eval_samples"), 20);  // 21 held-out samples: 5 whole batches of 4
  for (const char* k : {"r1_image_to_text", "r1_text_to_image", "itm_accuracy"}) {
    EXPECT_GE(all.at(k), 0.0) << k;
    EXPECT_LE(all.at(k), 1.0) << k;
  }
  EXPECT_TRUE(model.module->is_training());
  EXPECT_EQ(task->evaluate(*model.module, in), all);  // no randomness: the same numbers again
  in.max_samples = 9;
  EXPECT_EQ(task->evaluate(*model.module, in).at("eval_samples"), 8);
  in.max_samples = 3;
  EXPECT_NE(error_of([&] { task->evaluate(*model.module, in); }).find("fewer than one batch"), std::string::npos);
  const std::string progress = task->describe_progress(all, all);
  EXPECT_NE(progress.find("retrieval R@1"), std::string::npos) << progress;
  io::remove_tree(dir);
}

// The classifiers' evaluation (ViT's here; BERT's classify shares it): accuracy, macro F1 and the mean loss over
// whole batches, recomputed here by counting predictions one sample at a time; the model left training.
TEST(ClassifierEvaluation, AccuracyAndF1AsCountedByHand) {
  const std::string dir = "/tmp/shardtrain_recipes_cls_eval_" + std::to_string(::getpid());
  io::remove_tree(dir);
  data::SynthOptions o;
  o.out = dir, o.image_text_samples = 0, o.text_samples = 0, o.image_samples = 27, o.eval_samples = 0;
  o.samples_per_shard = 32, o.image_size = 32;
  data::write_synth_dataset(o);
  const auto recipe = recipe_for_task(recipe_of("vit-debug"), "classify", {});
  const auto task = recipe->task("classify");
  ASSERT_TRUE(task->has_evaluation());
  const DataNeeds needs = task->data_needs();
  const auto source =
      std::make_shared<data::SampleSource>(std::vector<std::string>{dir + "/image"}, data::SampleKind::IMAGE);
  data::LoaderOptions lo;
  lo.batch_size = 5, lo.workers = 0, lo.image_size = needs.image_size, lo.patch_size = needs.patch_size;
  lo.mim_probability = 0, lo.mix = {0, 0, 1};
  const data::Loader loader({nullptr, nullptr, source}, lo);
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::DistEnv{});
  ZooModel model = build_model(recipe);
  model.module->train();
  EvalInputs in;
  in.loader = &loader, in.source_size = source->size(), in.batch_size = 5, in.world = &pg.world();
  const auto metrics = task->evaluate(*model.module, in);
  EXPECT_TRUE(model.module->is_training());
  EXPECT_EQ(metrics.at("eval_samples"), 25);  // 27 samples: 5 whole batches of 5

  model.module->eval();
  c10::AutoGradMode no_grad(false);
  const int64_t classes = needs.num_labels;
  std::vector<int64_t> tp(classes, 0), truth(classes, 0), predicted(classes, 0);
  double loss = 0;
  int64_t hits = 0;
  for (int64_t start = 0; start < 25; start += 5) {
    const data::Batch b = loader.build(data::SampleKind::IMAGE, start);
    const at::Tensor logits = dynamic_cast<VitImpl&>(*model.module).run(b.pixels).logits;
    for (int64_t i = 0; i < 5; ++i) {
      const int64_t y = b.labels[i].item<int64_t>(), p = logits[i].argmax().item<int64_t>();
      ++truth[y], ++predicted[p];
      if (y == p) ++tp[y], ++hits;
      loss -= at::log_softmax(logits[i], 0)[y].item<double>();
    }
  }
  double f1 = 0;
  int64_t seen = 0;  // macro F1 over the classes true or predicted somewhere
  for (int64_t k = 0; k < classes; ++k) {
    if (truth[k] + predicted[k] > 0) f1 += 2.0 * tp[k] / (truth[k] + predicted[k]), ++seen;
  }
  EXPECT_DOUBLE_EQ(metrics.at("accuracy"), hits / 25.0);
  EXPECT_NEAR(metrics.at("f1"), f1 / seen, 1e-12);
  EXPECT_NEAR(metrics.at("eval_loss"), loss / 25, 1e-5);
  EXPECT_NE(task->describe_progress(metrics, metrics).find("accuracy"), std::string::npos);
  io::remove_tree(dir);
}

// ViT's multi-label loss: the binary cross-entropy of every output against the sample's set of classes, recomputed
// here by hand; the config says problem_type multi_label_classification; a batch of single class ids is refused.
TEST(ClassifierEvaluation, VitMultiLabelLossIsTheBinaryCrossEntropyOfEveryOutput) {
  const auto recipe = recipe_for_task(recipe_of("vit-debug"), "classify", {{}, true, std::nullopt, std::nullopt});
  const auto task = recipe->task("classify");
  const DataNeeds needs = task->data_needs();
  ASSERT_TRUE(needs.multi_label);
  EXPECT_NE(recipe->hf_config_json().find("multi_label_classification"), std::string::npos);
  ZooModel model = build_model(recipe);
  model.module->eval();  // no dropout: the same logits twice
  const data::Batch b = synthetic_batch(needs, 3, 0, 5);
  ASSERT_EQ(b.labels.sizes(), at::IntArrayRef({3, needs.num_labels}));
  const double loss = task->compute_losses(*model.module, b, 0).total.item<double>();
  const at::Tensor logits = dynamic_cast<VitImpl&>(*model.module).run(b.pixels).logits.to(at::kDouble);
  double want = 0;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t k = 0; k < needs.num_labels; ++k) {
      const double p = 1 / (1 + std::exp(-logits[i][k].item<double>())), y = b.labels[i][k].item<double>();
      want -= y * std::log(p) + (1 - y) * std::log(1 - p);
    }
  }
  EXPECT_NEAR(loss, want / static_cast<double>(3 * needs.num_labels), 1e-5);
  data::Batch ids = b;
  ids.labels = at::randint(0, needs.num_labels, {3}, at::kLong);
  EXPECT_NE(error_of([&] { task->compute_losses(*model.module, ids, 0); }).find("needs each sample's set of them"),
            std::string::npos);
}

}  // namespace
}  // namespace shardtrain::models
