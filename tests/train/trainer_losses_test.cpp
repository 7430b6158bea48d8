// The trainer's losses against transformers' on the same weights and batch: tests/reference/
// trainer_losses_reference.py builds a small model of a family with random weights (dropout off), saves it as a
// model directory with one batch of 8 rows of token ids, and trains transformers' model on that batch for 5 steps
// (the model's own loss, clip_grad_norm_ at 1.0, torch.optim.AdamW at 1e-3 with weight decay on tensors of two or
// more dimensions). `shardtrain train` then trains the directory on the batch on 2 ranks of 4 rows each (FULL_SHARD,
// the same optimizer settings): every step's loss in its metrics.csv must be transformers' to the 6 digits the file
// keeps. A fault common to the trainer's paths — the loss divided wrongly, clipping by another norm, weight decay
// on the wrong tensors, a model that computes its loss otherwise — shows here, where the trainer's other tests
// compare it only with itself (measured: without clipping T5's third loss is 1.6e-3 off; with decay on the 1-D
// tensors too, 3.6e-5 off, 2e-4 by the fifth).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardtrain/io/files.h"
#include "train/train_harness.h"

namespace shardtrain {
namespace {

using test::Outcome;
using test::run;

constexpr int kSteps = 5;

// The loss column of a run's metrics.csv, one value per logged step.
std::vector<double> logged_losses(const std::string& csv) {
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("step,loss,", 0), 0u) << header;
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) {
    std::stringstream fields(line);
    std::string step, loss;
    std::getline(fields, step, ',');
    std::getline(fields, loss, ',');
    losses.push_back(std::stod(loss));
  }
  return losses;
}

// `family`'s fixture and reference losses from transformers, then the trainer on the same directory and batch.
void expect_transformers_losses(const std::string& family, const std::string& task_flags) {
  const std::string dir = "/tmp/shardtrain_trainer_losses_" + family + "_" + std::to_string(::getpid());
  io::remove_tree(dir);
  const Outcome reference = run(std::string(SHARDTRAIN_PYTHON) + " " + SHARDTRAIN_SOURCE_DIR +
                                "/tests/reference/trainer_losses_reference.py " + family + " " + dir + " " +
                                std::to_string(kSteps));
  ASSERT_EQ(reference.status, 0) << reference.output;
  const nlohmann::json expected = nlohmann::json::parse(test::read_text(dir + "/expected.json"));
  std::ofstream(dir + "/config.yaml") << "model: {from: " << dir << "/model}\n";
  const std::string bin = SHARDTRAIN_BIN;
  const Outcome trained = run(bin + " launch --nproc-per-node 2 -- " + bin + " train " + dir + "/config.yaml " +
                              task_flags + " --data.text=[" + dir + "/batch.jsonl] --train.batch_size=4" +
                              " --train.grad_accum=1 --train.steps=" + std::to_string(kSteps) +
                              " --train.max_grad_norm=1 --optim.name=adamw --optim.lr=1e-3 --optim.schedule=constant" +
                              " --optim.warmup_steps=0 --optim.weight_decay=0.1 --optim.no_decay_1d=true" +
                              " --train.eval_interval=0 --checkpoint.interval=0 --log.interval=1" +
                              " --log.progress=lines --log.dir=" + dir + "/log");
  ASSERT_EQ(trained.status, 0) << trained.output;
  const std::vector<double> ours = logged_losses(dir + "/log/metrics.csv");
  ASSERT_EQ(ours.size(), static_cast<size_t>(kSteps)) << trained.output;
  const auto& theirs = expected.at("losses");
  ASSERT_EQ(theirs.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    const double want = theirs[static_cast<size_t>(s)].get<double>();
    // metrics.csv keeps 6 significant digits: half a unit of the last is 5e-6 of the value.
    EXPECT_NEAR(ours[static_cast<size_t>(s)], want, 1e-5 * std::abs(want)) << family << ", step " << s + 1;
  }
  EXPECT_LT(ours.back(), ours.front()) << "it did not train";
  io::remove_tree(dir);
}

TEST(TrainerLosses, LlamaCausalLmEqualsTransformers) { expect_transformers_losses("llama", ""); }

TEST(TrainerLosses, BertClassifierEqualsTransformers) { expect_transformers_losses("bert", ""); }

TEST(TrainerLosses, T5Seq2SeqEqualsTransformers) {
  expect_transformers_losses("t5", "--model.task=seq2seq --data.text_fields=[input_ids,labels]");
}

}  // namespace
}  // namespace shardtrain
