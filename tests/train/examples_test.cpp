// The examples under examples/ run as a user runs them, and do what their comments say.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace shardtrain::test
