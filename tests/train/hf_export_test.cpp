// `shardtrain checkpoint export --hf` into transformers and back, for every family: a debug flavor (BERT's with
// model.overrides: a custom size, and BERT, Llama, Qwen2 (its head tied) and GPT-2 as sequence classifiers; and the
// first BERT export trained again from its directory, model.from, with and without overrides) trains two steps, its
// checkpoint is exported as a Hugging Face model directory (sharded with an index for two families; Llama also as
// Llama 3.2's shape: tied head, RoPE scaling; Mistral's, Qwen2's and Qwen3's debug flavors, which share Llama's
// decoder), and
// tests/reference/hf_export_check.py loads it with transformers' from_pretrained (no weight missing), records a
// batch and transformers' outputs. shardtrain's model built from the same directory (model.from's path: its
// config.json, its weights) must hold exactly the checkpoint's parameters and give transformers' outputs to 1e-5 of
// their scale; transformers' tokenizer from the directory must tokenize as shardtrain's WordPiece does; and
// `shardtrain generate` on a causal LM's or T5's directory must make the tokens transformers' generate makes, in
// one process and sharded over ranks (`shardtrain launch ... -- shardtrain generate`).
#include <gtest/gtest.h>

#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <array>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/models/bert.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/vit.h"
#include "shardtrain/models/zoo.h"
#include "train/train_harness.h"

namespace shardtrain {
namespace {

using test::Outcome;
using test::run;

void expect_close(const at::Tensor& ours, const at::Tensor& reference, const std::string& what) {
  ASSERT_TRUE(ours.defined()) << what << " not computed";
  ASSERT_EQ(ours.sizes(), reference.sizes()) << what;
  const double scale = reference.abs().max().item<double>();
  const double diff = (ours - reference).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5 * scale) << what << ": max |ours - transformers| = " << diff << ", scale " << scale;
}

// shardtrain's outputs on the batch hf_export_check.py recorded, compared with transformers'.
void compare_outputs(const std::string& family, torch::nn::Module& module, const io::SafetensorsReader& io) {
  auto ref = [&](const char* name) { return io.read(name); };
  if (family == "bert") {
    models::BertOutputs o = dynamic_cast<models::BertImpl&>(module).run(ref("input_ids"), ref("attention_mask"),
                                                                ref("token_type_ids"), {});
    expect_close(o.hidden, ref("hidden"), "BERT hidden states");
    expect_close(o.pooled, ref("pooled"), "BERT pooled output");
    expect_close(o.logits, ref("logits"), "BERT head's logits (masked-LM or classifier)");
  } else if (family == "vit") {
    models::VitOutputs o = dynamic_cast<models::VitImpl&>(module).run(ref("pixels"), {});
    expect_close(o.hidden, ref("hidden"), "ViT hidden states");
    expect_close(o.logits, ref("logits"), "ViT logits");
  } else if (family == "t5") {
    models::T5Outputs o = dynamic_cast<models::T5Impl&>(module).run(ref("input_ids"), ref("attention_mask"), {}, ref("labels"));
    expect_close(o.encoder_hidden, ref("encoder_hidden"), "T5 encoder hidden states");
    expect_close(o.logits, ref("logits"), "T5 logits");
    expect_close(o.loss, ref("loss"), "T5 loss");
  } else if (family == "llama" || family == "mistral" || family == "qwen2" || family == "qwen3") {
    models::LlamaOutputs o = dynamic_cast<models::LlamaImpl&>(module).run(ref("input_ids"), ref("attention_mask"),
                                                                  ref("labels"));
    expect_close(o.logits, ref("logits"), "Llama logits");
    expect_close(o.loss, ref("loss"), "Llama loss");
  } else if (family == "gpt2") {
    models::Gpt2Outputs o = dynamic_cast<models::Gpt2Impl&>(module).run(ref("input_ids"), ref("attention_mask"),
                                                                ref("labels"));
    expect_close(o.logits, ref("logits"), "GPT-2 logits");
    expect_close(o.loss, ref("loss"), "GPT-2 loss");
  } else if (family == "flava") {
    models::FlavaBatch b{ref("input_ids"), ref("input_ids_masked"), ref("attention_mask"),
                         ref("pixels"),    ref("codebook_pixels"),  ref("masked_patches"),
                         ref("mlm_labels"), {},                     ref("itm_labels")};
    models::FlavaOutputs o = dynamic_cast<models::FlavaImpl&>(module).run(b);
    expect_close(o.loss, ref("loss"), "FLAVA image-text loss");
    expect_close(o.itm_logits, ref("itm_logits"), "FLAVA ITM logits");
    expect_close(o.logits_per_image, ref("logits_per_image"), "FLAVA contrastive logits");
  } else {
    FAIL() << "no comparison for " << family;
  }
}

TEST(HfExport, EveryFamilyLoadsIntoTransformersWithTheSameOutputs) {
  const std::string root = "/tmp/shardtrain_hf_export_test_" + std::to_string(::getpid());
  const Outcome synth = test::write_flava_suite(root);
  ASSERT_EQ(synth.status, 0) << synth.output;
  const data::WordPieceTokenizer tokenizer(data::load_vocab(root + "/data/vocab.txt"), /*lowercase=*/true);
  // (name, family, what the run adds): BERT with a custom size, as a sequence classifier (the synthetic texts'
  // .cls labels: the first object's shape) exported as BertForSequenceClassification, and the custom size's
  // export as model.from: without overrides its config.json is kept whole (a key shardtrain does not read is added
  // to it below and must come back), with them (another head count: the same weights, other outputs; or a layer
  // fewer, loaded as transformers' from_pretrained would, the third layer left and said so; or a wider MLP with
  // model.ignore_mismatched_sizes, its matrices initialized and said so) the recipe's replaces it.
  const std::string from = " --model.from=" + root + "/bert-hf";
  const std::string shapes = " --model.task=classify '--data.labels=[circle, square, triangle, diamond, cross]' "
                             "--data.eval=[" + root + "/data/text]";
  const std::vector<std::array<std::string, 3>> cases = {
      {"bert", "bert", " '--model.overrides={layers: 3, dim: 48, heads: 6}'"},
      {"bert-classify", "bert", shapes},
      {"bert-from", "bert", from},
      {"bert-from-overrides", "bert", from + " '--model.overrides={heads: 4}'"},
      {"bert-from-fewer-layers", "bert", from + " '--model.overrides={layers: 2}'"},
      {"bert-from-wider-mlp", "bert", from + " '--model.overrides={mlp_dim: 80}' --model.ignore_mismatched_sizes=true"},
      {"vit", "vit", ""}, {"t5", "t5", ""}, {"llama", "llama", ""}, {"llama-3.2", "llama", ""},
      {"mistral", "mistral", ""}, {"qwen2", "qwen2", ""}, {"qwen3", "qwen3", ""}, {"gpt2", "gpt2", ""},
      {"flava", "flava", ""}, {"llama-classify", "llama", shapes}, {"qwen2-classify", "qwen2", shapes},
      {"gpt2-classify", "gpt2", shapes}};
  const std::string kept = "\"key_only_the_source_has\": \"kept\"";
  for (const auto& [name, family, extra] : cases) {
    SCOPED_TRACE(name);
    if (name == "bert-from") {  // the source directory gets a key of its own
      std::string source = test::read_text(root + "/bert-hf/config.json");
      source.insert(source.find('{') + 1, kept + ",");
      io::write_file_atomic(root + "/bert-hf/config.json", std::vector<char>(source.begin(), source.end()));
    }
    const std::string flavor = name == "llama-3.2" ? "llama-3.2-debug" : family + "-debug";
    const std::string ck = root + "/" + name + "-ck", out = root + "/" + name + "-hf";
    const Outcome trained = run(std::string(SHARDTRAIN_BIN) + " train " + root + "/config.yaml --model.flavor=" +
                                flavor + extra + " --train.steps=2 --train.eval_interval=0 --launch.num_processes=1 "
                                "--checkpoint.dir=" + ck + " --log.dir=" + root + "/" + name + "-log");
    ASSERT_EQ(trained.status, 0) << trained.output;
    // Shards of at most 300 kB for the two larger models (0.8 and 1.0 MB): an index and several files.
    const bool sharded = family == "llama" || family == "flava";
    const Outcome exported = run(std::string(SHARDTRAIN_BIN) + " checkpoint export " + ck + " --hf " + out +
                                 (sharded ? " --max-shard-size 300KB" : ""));
    ASSERT_EQ(exported.status, 0) << exported.output;
    EXPECT_NE(exported.output.find("config.json, model"), std::string::npos) << exported.output;
    EXPECT_EQ(io::path_exists(out + "/model.safetensors.index.json"), sharded) << exported.output;
    EXPECT_NE(exported.output.find("vocab.txt, tokenizer_config.json"), std::string::npos) << exported.output;

    // The generating families: `shardtrain generate` on the directory, which the check continues with
    // transformers' generate too (the same tokens).
    const bool classifies = name.find("classify") != std::string::npos;
    const bool generates = family != "bert" && family != "vit" && family != "flava" && !classifies;
    if (generates) {
      const Outcome generated = run(std::string(SHARDTRAIN_BIN) + " generate " + out + " 'a red circle' " +
                                    "'two small squares on the left of a blue triangle' --max-new-tokens 6 --json " +
                                    "--out " + out + "/generated.jsonl");
      ASSERT_EQ(generated.status, 0) << generated.output;
    }
    // Generation from a model sharded over 3 ranks (a tied head, an encoder-decoder): the ranks take the batches
    // in turn, the third generating from the first again unreported; rank 0 writes what one process writes. Beam
    // search too, in one process as transformers' and sharded.
    if (name == "t5" || name == "gpt2" || name == "llama-3.2") {
      const std::string generate = " generate " + out + " 'a red circle' 'two small squares on the left of a blue "
                                   "triangle' --max-new-tokens 6 --batch-size 1 --json --out " + out;
      const Outcome one = run(std::string(SHARDTRAIN_BIN) + generate + "/one.jsonl");
      ASSERT_EQ(one.status, 0) << one.output;
      const Outcome sharded = run(std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 3 -- " + SHARDTRAIN_BIN +
                                  generate + "/sharded.jsonl");
      ASSERT_EQ(sharded.status, 0) << sharded.output;
      EXPECT_NE(sharded.output.find(", sharded over 3 ranks)"), std::string::npos) << sharded.output;
      EXPECT_EQ(test::read_text(out + "/sharded.jsonl"), test::read_text(out + "/one.jsonl"));
      // Beam search: transformers' hypotheses (hf_export_check.py with num_beams), and the same sharded.
      const std::string beams = generate + "/beams.jsonl --num-beams 3";
      const Outcome beamed = run(std::string(SHARDTRAIN_BIN) + beams);
      ASSERT_EQ(beamed.status, 0) << beamed.output;
      EXPECT_NE(beamed.output.find("beam search over 3"), std::string::npos) << beamed.output;
      const Outcome beam_check = run(std::string(SHARDTRAIN_PYTHON) + " " + SHARDTRAIN_SOURCE_DIR +
                                     "/tests/reference/hf_export_check.py " + out + " " + out +
                                     "/beams-io.safetensors " + out + "/beams.jsonl " +
                                     "'{\"num_beams\": 3, \"max_new_tokens\": 6}'");
      EXPECT_NE(beam_check.output.find("generation: 2 prompts continued as transformers' generate"), std::string::npos)
          << beam_check.output;
      const Outcome sharded_beams = run(std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 3 -- " +
                                        SHARDTRAIN_BIN + generate + "/sharded-beams.jsonl --num-beams 3");
      ASSERT_EQ(sharded_beams.status, 0) << sharded_beams.output;
      EXPECT_EQ(test::read_text(out + "/sharded-beams.jsonl"), test::read_text(out + "/beams.jsonl"));
      const Outcome pinned = run(std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 2 -- " + SHARDTRAIN_BIN +
                                 generate + "/x.jsonl --device cuda:0");
      EXPECT_NE(pinned.output.find("--device cuda:0 under a launcher of 2 ranks: give --device cuda"),
                std::string::npos) << pinned.output;
    }
    if (name == "bert") {  // bad input to generate: each named
      for (const auto& [options, message] : std::vector<std::pair<std::string, std::string>>{
               {" 'a red circle'", "bert (" + out + ") does not generate text"},
               {"", "no prompt: give PROMPT arguments or --prompts FILE"},
               {" x --dtype float8", "--dtype: 'float8' is not float32, bfloat16 or float16"},
               {" x --top-p 0", "top_p 0: expected in (0, 1]"}}) {
        const Outcome refused = run(std::string(SHARDTRAIN_BIN) + " generate " + out + options);
        EXPECT_EQ(refused.status, 2) << refused.output;
        EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
      }
    }
    const Outcome checked = run(std::string(SHARDTRAIN_PYTHON) + " " + SHARDTRAIN_SOURCE_DIR +
                                "/tests/reference/hf_export_check.py " + out + " " + out + "/io.safetensors" +
                                (generates ? " " + out + "/generated.jsonl" : ""));
    ASSERT_EQ(checked.status, 0) << checked.output;
    if (generates) {
      EXPECT_NE(checked.output.find("generation: 2 prompts continued as transformers' generate"), std::string::npos)
          << checked.output;
    }
    EXPECT_NE(checked.output.find("every weight loaded"), std::string::npos) << checked.output;
    const std::string classifier_class = std::string(family == "bert"    ? "Bert"
                                                     : family == "llama" ? "Llama"
                                                     : family == "qwen2" ? "Qwen2"
                                                                         : "GPT2") +
                                         "ForSequenceClassification";
    if (classifies) {
      EXPECT_NE(checked.output.find(classifier_class + " from"), std::string::npos) << checked.output;
      EXPECT_NE(test::read_text(out + "/config.json").find("\"4\": \"cross\""), std::string::npos);  // id2label
    }
    if (classifies && family != "bert") {  // transformers pools by pad_token_id; a classifier generates nothing
      EXPECT_NE(test::read_text(out + "/config.json").find("\"pad_token_id\": 0"), std::string::npos);
      const Outcome refused = run(std::string(SHARDTRAIN_BIN) + " generate " + out + " 'a red circle'");
      EXPECT_EQ(refused.status, 2) << refused.output;
      EXPECT_NE(refused.output.find("is a sequence classifier (" + classifier_class + "): it does not generate text"),
                std::string::npos) << refused.output;
    }
    if (name.rfind("bert-from", 0) == 0) {
      const std::string config = test::read_text(out + "/config.json");
      EXPECT_EQ(config.find("\"key_only_the_source_has\"") != std::string::npos, name == "bert-from") << config;
      const std::string heads = name == "bert-from-overrides" ? "4" : "6";
      const std::string layers = name == "bert-from-fewer-layers" ? "2" : "3";
      EXPECT_NE(config.find("\"num_attention_heads\": " + heads), std::string::npos) << config;
      EXPECT_NE(config.find("\"num_hidden_layers\": " + layers), std::string::npos) << config;
    }
    if (name == "llama-3.2") {  // the tied head, the heads' width and the RoPE scaling, as transformers reads them
      const std::string config = test::read_text(out + "/config.json");
      for (const char* key : {"\"tie_word_embeddings\": true", "\"head_dim\": 32", "\"rope_type\": \"llama3\"",
                              "\"original_max_position_embeddings\": 64"}) {
        EXPECT_NE(config.find(key), std::string::npos) << key << " in " << config;
      }
    }
    if (name == "bert-from-fewer-layers") {
      EXPECT_NE(trained.output.find("left out by model.overrides): bert.encoder.layer.2."), std::string::npos)
          << trained.output;
    }
    if (name == "bert-from-wider-mlp") {
      EXPECT_NE(trained.output.find("model.ignore_mismatched_sizes): bert.encoder.layer.0.intermediate.dense.weight: "
                                    "[64, 48] -> [80, 48]"),
                std::string::npos) << trained.output;
    }

    // The directory as model.from reads it: its config.json gives the model, its files the weights.
    models::ZooModel ours = models::build_model(models::recipe_of_model(out));
    EXPECT_EQ(ours.family, family);
    if (name.rfind("bert", 0) == 0 && !classifies) {
      EXPECT_EQ(ours.module->named_parameters()["layers.1.mlp.fc1.weight"].size(1), 48);
    }
    models::load_weights(*ours.module, out, ours.names);
    ours.module->eval();
    const auto saved = test::saved_state(ck + "/step-00000002", io::path_exists(ck + "/step-00000002/model"));
    for (const auto& p : ours.module->named_parameters()) {
      ASSERT_TRUE(saved.count(p.key())) << p.key();
      EXPECT_TRUE(at::equal(saved.at(p.key()), p.value())) << p.key() << " differs from the checkpoint's";
    }
    const io::SafetensorsReader io(out + "/io.safetensors");
    compare_outputs(family, *ours.module, io);
    const auto ids = tokenizer.encode("a red square beside a blue circle", 64);
    std::vector<int64_t> ours_ids;
    for (size_t i = 0; i < ids.ids.size() && ids.attention_mask[i] == 1; ++i) ours_ids.push_back(ids.ids[i]);
    EXPECT_TRUE(at::equal(io.read("tokenized"), at::tensor(ours_ids, at::kLong))) << io.read("tokenized");
  }
  io::remove_tree(root);
}

}  // namespace
}  // namespace shardtrain
