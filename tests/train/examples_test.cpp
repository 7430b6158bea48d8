// The examples under examples/ run as a user runs them, and do what their comments say.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "train_harness.h"

namespace shardtrain::test {
namespace {

// The loss printed for each step, by step ("step 7 loss 0.776271999").
std::map<int, std::string> losses_of(const std::string& output) {
  std::map<int, std::string> out;
  const std::regex line(R"(step (\d+) loss (\S+))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    out[std::stoi((*it)[1])] = (*it)[2];
  }
  return out;
}

// examples/custom_model.cpp: a user's own module tree under fully_shard, activation checkpointing and bf16 learns,
// and a run stopped at step 7 and started again continues from its checkpoint to the same losses, digit for digit.
TEST(Examples, CustomModelTrainsAndResumesExactly) {
  const std::string root = "/tmp/shardtrain_custom_model_" + std::to_string(::getpid());
  io::remove_tree(root);
  const std::string launch = std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 2 -- " + CUSTOM_MODEL_BIN + " ";
  const Outcome whole = run(launch + root + "/whole 20");
  ASSERT_EQ(whole.status, 0) << whole.output;
  const Outcome first = run(launch + root + "/split 7");
  ASSERT_EQ(first.status, 0) << first.output;
  const Outcome second = run(launch + root + "/split 20");
  ASSERT_EQ(second.status, 0) << second.output;

  const std::map<int, std::string> a = losses_of(whole.output), b = losses_of(first.output),
                                   c = losses_of(second.output);
  ASSERT_EQ(a.size(), 20u) << whole.output;
  ASSERT_EQ(b.size(), 7u) << first.output;
  ASSERT_EQ(c.size(), 13u) << second.output;  // steps 8..20: it resumed from step 7's checkpoint
  for (const auto& [step, loss] : b) EXPECT_EQ(loss, a.at(step)) << "step " << step;
  for (const auto& [step, loss] : c) EXPECT_EQ(loss, a.at(step)) << "step " << step;
  double early = 0, late = 0;
  for (int s = 1; s <= 3; ++s) early += std::stod(a.at(s)) / 3;
  for (int s = 18; s <= 20; ++s) late += std::stod(a.at(s)) / 3;
  EXPECT_LT(late, 0.5 * early) << whole.output;
  for (const char* step : {"step-00000005", "step-00000007", "step-00000020"}) {
    EXPECT_TRUE(io::path_exists(root + "/split/" + step)) << step;
  }
  io::remove_tree(root);
}

// examples/bert_classify/run.sh: a random BertForMaskedLM written by transformers, pretrained briefly, fine-tuned as
// a sentence-pair classifier in GLUE MRPC's TSV layout on 2 ranks, exported, and scored by transformers. The log
// names the head it created and the one it left unused; the run beats chance on the held-out pairs, and
// transformers' AutoModelForSequenceClassification on the export clears the script's bar (check.py).
TEST(Examples, BertClassifierFineTunedFromAHuggingFaceDirectory) {
  const std::string out = "/tmp/shardtrain_bert_classify_" + std::to_string(::getpid());
  const std::string build = std::filesystem::path(SHARDTRAIN_BIN).parent_path().string();
  const Outcome r = run("PYTHON=" + std::string(SHARDTRAIN_PYTHON) + " " + SHARDTRAIN_SOURCE_DIR +
                        "/examples/bert_classify/run.sh " + build + " " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("newly initialized (not in init_weights; the classify head): bert.pooler.dense.weight, "
                          "bert.pooler.dense.bias, classifier.weight, classifier.bias"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("unused (in init_weights, another task's head): cls.predictions.bias"), std::string::npos)
      << r.output;
  const std::smatch done = [&] {
    std::smatch m;
    std::regex_search(r.output, m, std::regex(R"(accuracy ([0-9.]+) -> ([0-9.]+), F1)"));
    return m;
  }();
  ASSERT_EQ(done.size(), 3u) << r.output;
  EXPECT_LT(std::stod(done[1]), 0.6) << r.output;  // the fresh classifier starts near chance
  EXPECT_GT(std::stod(done[2]), 0.65) << r.output;
  EXPECT_NE(r.output.find("check: transformers' BertForSequenceClassification (not_equivalent, equivalent)"),
            std::string::npos)
      << r.output;
  io::remove_tree(out);
}

}  // namespace
}  // namespace shardtrain::test
