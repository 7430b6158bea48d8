// The export library (shardtrain/hf/export.h) called directly, on a checkpoint saved in this process: a Llama's
// model directory holds transformers' config and every tensor under transformers' names with the model's values; a
// single file holds the same; an export whose directory cannot be written throws and leaves nothing.
// (tests/train/hf_export_test.cpp runs the command on every family and loads the result with transformers.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/config/config.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/generate/generator.h"
#include "shardtrain/hf/export.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/models/build.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"

namespace shardtrain {
namespace {

// A llama-debug initialised from `seed`, saved by one process as a run's checkpoint in `root`/ck.
struct SavedLlama {
  std::shared_ptr<const models::ModelRecipe> recipe = models::recipe_of("llama-debug");
  std::shared_ptr<torch::nn::Module> model;
  std::string checkpoint;

  SavedLlama(const std::string& root, uint64_t seed) {
    io::remove_tree(root);
    models::BuildOptions build;
    build.init.seed = seed;
    model = recipe->build(build);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    dist::ProcessGroup pg = dist::ProcessGroup::init(dist::DistEnv{});
    config::Config c;
    c.model.flavor = "llama-debug";
    ckpt::TrainerState state;
    state.step = 5, state.flavor = c.model.flavor, state.run_id = "library-test";
    state.config_yaml = config::to_yaml(c);
    checkpoint = ckpt::save_checkpoint(root + "/ck", state, {model, &optimizer, /*sharded=*/false, {}}, pg.world());
  }
};

TEST(ExportLibrary, ACheckpointBecomesAModelDirectoryAndAFile) {
  const std::string root = "/tmp/shardtrain_export_library_" + std::to_string(::getpid());
  const SavedLlama saved(root, 3);
  const auto& recipe = saved.recipe;
  const auto& model = saved.model;
  const std::string& checkpoint = saved.checkpoint;

  const std::string said = hf::export_directory(checkpoint, root + "/hf", {}, int64_t{5} << 30);
  EXPECT_EQ(said.rfind("checkpoint export: " + checkpoint + " -> " + root + "/hf (config.json, model.safetensors", 0),
            0u) << said;
  const std::vector<char> bytes = io::read_file(root + "/hf/config.json");
  const nlohmann::json config = nlohmann::json::parse(bytes.begin(), bytes.end());
  EXPECT_EQ(config.at("model_type"), "llama");
  EXPECT_EQ(config.at("torch_dtype"), "float32");
  const io::SafetensorsReader file(root + "/hf/model.safetensors");
  const auto names = models::hf_names_of(*model, recipe->hf_names());
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(file.entries().size(), names.size());
  const auto params = model->named_parameters();
  for (const auto& [ours, theirs] : names) {
    const at::Tensor* p = params.find(ours);
    if (p == nullptr) continue;  // a buffer
    EXPECT_TRUE(at::equal(file.read(theirs), p->detach())) << ours << " as " << theirs;
  }

  EXPECT_EQ(hf::export_model_file(checkpoint, root + "/model.safetensors", {}),
            "checkpoint export: " + checkpoint + " -> " + root + "/model.safetensors");
  EXPECT_EQ(io::SafetensorsReader(root + "/model.safetensors").entries().size(), names.size());

  // A directory that cannot be made (under a regular file): the error, and nothing left behind.
  io::write_file_atomic(root + "/plain", {'x'});
  EXPECT_THROW(hf::export_directory(checkpoint, root + "/plain/hf", {}, int64_t{5} << 30), std::runtime_error);
  EXPECT_THROW(hf::export_peft_adapter(checkpoint, root + "/peft", {}), std::invalid_argument);  // no LoRA
  EXPECT_FALSE(io::path_exists(root + "/peft"));
  io::remove_tree(root);
}

// The generation library on an exported directory (a WordPiece vocabulary of the model's 1000 ids beside it): the
// completions arrive in the prompts' order whatever the batches, and a prompt continued beside longer ones in a
// left-padded batch is continued as it is alone.
TEST(GeneratorLibrary, BatchesAndOrderDoNotChangeACompletion) {
  const std::string root = "/tmp/shardtrain_generator_library_" + std::to_string(::getpid());
  const SavedLlama saved(root, 5);
  hf::export_directory(saved.checkpoint, root + "/hf", {}, int64_t{5} << 30);
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (int i = 5; i < 1000; ++i) vocab += "w" + std::to_string(i) + "\n";
  io::write_file_atomic(root + "/hf/vocab.txt", std::vector<char>(vocab.begin(), vocab.end()));

  generate::GeneratorOptions o;
  o.model = root + "/hf";
  auto run = [&](int64_t batch, const std::vector<std::string>& prompts) {
    o.batch_size = batch;
    const auto tokenizer = data::open_tokenizer(o.model);
    models::GenerationOptions g = generate::generation_config(o.model, *tokenizer);
    g.max_new_tokens = 4, g.do_sample = false;
    generate::Generator generator(o, g);
    std::vector<generate::Completion> out;
    const int64_t made = generator.run(prompts, [&](const generate::Completion& done) { out.push_back(done); });
    int64_t counted = 0;
    for (const auto& done : out) counted += static_cast<int64_t>(done.tokens.size());
    EXPECT_EQ(made, counted);
    return out;
  };
  const std::vector<std::string> prompts = {"w7 w8 w9 w10 w11", "w12", "w13 w14 w15"};
  const auto together = run(2, prompts);
  ASSERT_EQ(together.size(), 3u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(together[i].prompt, i);
    EXPECT_FALSE(together[i].tokens.empty());
    const auto alone = run(1, {prompts[i]});
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0].tokens, together[i].tokens) << "prompt " << i;
  }
  io::remove_tree(root);
}

}  // namespace
}  // namespace shardtrain
