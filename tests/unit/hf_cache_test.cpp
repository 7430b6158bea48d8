// io::hf_hub_cache_dir / find_in_hf_cache / resolve_hf_model: model names found in a Hugging Face cache laid out
// as huggingface_hub lays it out (models--org--name/{refs/main, snapshots/<commit>/ with links into blobs/}), the
// cache directory chosen by huggingface_hub's environment variables, and clear errors when a name is not there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "shardtrain/config/config.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/hf_cache.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/models/zoo.h"
#include "support/expect_error.h"

namespace shardtrain::io {
namespace {

using testing::expect_error;

// Sets environment variables for a test's lifetime and restores what was there.
class EnvGuard {
 public:
  void set(const std::string& name, const std::optional<std::string>& value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

struct ScratchDir {
  std::string path = "/tmp/shardtrain_hf_cache_test_" + std::to_string(::getpid());
  ScratchDir() { make_directories(path); }
  ~ScratchDir() { remove_tree(path); }
};

void write_text(const std::string& path, const std::string& text) {
  write_file_atomic(path, std::vector<char>(text.begin(), text.end()));
}

// models--<org>--<name>/snapshots/<commit>/config.json, a link to blobs/<hash> as huggingface_hub makes it.
void add_snapshot(const std::string& cache, const std::string& folder, const std::string& commit,
                  const std::string& config_json) {
  const std::string repo = cache + "/" + folder;
  make_directories(repo + "/blobs");
  make_directories(repo + "/snapshots/" + commit);
  write_text(repo + "/blobs/" + commit + "-config", config_json);
  ASSERT_EQ(::symlink(("../../blobs/" + commit + "-config").c_str(),
                      (repo + "/snapshots/" + commit + "/config.json").c_str()), 0);
}

const char* kBertConfig = R"({"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 1000,
  "max_position_embeddings": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
  "intermediate_size": 64})";

TEST(HfCache, TheDirectoryIsHuggingFaceHubs) {
  EnvGuard env;
  for (const char* name : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"}) env.set(name, {});
  env.set("HOME", "/home/u");
  EXPECT_EQ(hf_hub_cache_dir(), "/home/u/.cache/huggingface/hub");
  env.set("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(hf_hub_cache_dir(), "/xdg/huggingface/hub");
  env.set("HF_HOME", "/hf");
  EXPECT_EQ(hf_hub_cache_dir(), "/hf/hub");
  env.set("HUGGINGFACE_HUB_CACHE", "/legacy");
  EXPECT_EQ(hf_hub_cache_dir(), "/legacy");
  env.set("HF_HUB_CACHE", "/cache");
  EXPECT_EQ(hf_hub_cache_dir(), "/cache");
}

TEST(HfCache, HubIds) {
  for (const char* id : {"bert-base-uncased", "google/t5-v1_1-xl", "facebook/flava-full", "org/name.v2"}) {
    EXPECT_TRUE(looks_like_hub_id(id)) << id;
  }
  for (const char* id : {"", "a/b/c", "../x", "org/..", "a b", "/abs", "org/", "x.json/"}) {
    EXPECT_FALSE(looks_like_hub_id(id)) << id;
  }
}

// refs/main chooses the snapshot; without it the one there; a model name builds its recipe from the cache.
TEST(HfCache, FindsTheSnapshotAsFromPretrainedDoes) {
  const ScratchDir dir;
  EnvGuard env;
  env.set("HF_HUB_CACHE", dir.path);
  add_snapshot(dir.path, "models--org--tiny-bert", "aaaa", kBertConfig);
  add_snapshot(dir.path, "models--org--tiny-bert", "bbbb", kBertConfig);
  make_directories(dir.path + "/models--org--tiny-bert/refs");
  write_text(dir.path + "/models--org--tiny-bert/refs/main", "bbbb\n");
  EXPECT_EQ(find_in_hf_cache("org/tiny-bert"), dir.path + "/models--org--tiny-bert/snapshots/bbbb");
  EXPECT_EQ(resolve_hf_model("org/tiny-bert", "model.from"), dir.path + "/models--org--tiny-bert/snapshots/bbbb");
  const auto recipe = models::recipe_of_model("org/tiny-bert");
  EXPECT_EQ(recipe->family(), "bert");
  EXPECT_EQ(recipe->flavor(), dir.path + "/models--org--tiny-bert/snapshots/bbbb");

  add_snapshot(dir.path, "models--solo", "cccc", kBertConfig);  // a name without an organisation, no refs/main
  EXPECT_EQ(find_in_hf_cache("solo"), dir.path + "/models--solo/snapshots/cccc");
  EXPECT_EQ(models::recipe_of_model("solo")->family(), "bert");
  EXPECT_EQ(find_in_hf_cache("org/absent"), std::nullopt);
  EXPECT_EQ(resolve_hf_model(dir.path, "model.from"), dir.path);  // a directory is itself

  remove_tree(dir.path + "/models--org--tiny-bert/refs");
  expect_error<std::runtime_error>([&] { find_in_hf_cache("org/tiny-bert"); },
                                   {"org/tiny-bert", "2 snapshots", "no refs/main"});
  make_directories(dir.path + "/models--org--tiny-bert/refs");
  write_text(dir.path + "/models--org--tiny-bert/refs/main", "dddd");
  expect_error<std::runtime_error>([&] { find_in_hf_cache("org/tiny-bert"); }, {"refs/main names snapshot 'dddd'"});
  expect_error<std::invalid_argument>([&] { resolve_hf_model("org/absent", "model.from"); },
                                      {"model.from: 'org/absent'", dir.path, "huggingface-cli download org/absent"});
  expect_error<std::invalid_argument>([&] { models::recipe_of_model("no-such-flavor"); },
                                      {"model name in the Hugging Face cache (" + dir.path + ")"});
}

// A trainer config naming weights or a tokenizer by model name: the snapshot's directory once read; a name the
// cache does not hold stays as written (a relative path, whose own error comes when it is opened).
TEST(HfCache, ConfigKeysTakeModelNames) {
  const ScratchDir dir;
  EnvGuard env;
  env.set("HF_HUB_CACHE", dir.path);
  add_snapshot(dir.path, "models--org--tiny-bert", "aaaa", kBertConfig);
  const config::Config c = config::parse_config("model: {init_weights: org/tiny-bert}\n"
                                                "data: {tokenizer: org/tiny-bert}\n", "test.yaml", {});
  EXPECT_EQ(c.model.init_weights, dir.path + "/models--org--tiny-bert/snapshots/aaaa");
  EXPECT_EQ(c.data.tokenizer, dir.path + "/models--org--tiny-bert/snapshots/aaaa");
  const config::Config relative = config::parse_config("data: {tokenizer: vocab.txt}\n", "test.yaml", {});
  EXPECT_EQ(relative.data.tokenizer, "vocab.txt");
}

}  // namespace
}  // namespace shardtrain::io
