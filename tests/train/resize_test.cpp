// Resume at another world size, compared by value with a run that never stopped. A causal LM (llama-debug) trains
// at a global batch of 12 rows of 32 packed tokens, once straight through on 4 ranks and once in legs of one step,
// each resuming the last leg's sharded checkpoint at another world size — 4, 2, 1, 3 ranks, the rows a rank takes
// (train.batch_size) changed with it so that the global batch stays 12. Rows packed full weigh every
// token alike however they are split, nothing draws random numbers (no dropout, no masking), and the loader's
// position is global, so after every leg the legs' run must hold what the straight run holds at that step: every
// parameter and every optimizer state tensor (AdamW's moments; AnyPrecision AdamW's bf16 moments and Kahan
// compensation; Adafactor's factored statistics), the step count of every parameter's optimizer, and the samples
// consumed. What may differ is the order in which ranks' gradients are summed: float32 rounding, which AdamW's
// division by the root of the second moment enlarges where a gradient is near zero.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/io/files.h"
#include "train/train_harness.h"

namespace shardtrain {
namespace {

using test::max_difference;
using test::Outcome;
using test::run;

class ResumeAtOtherSizes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = "/tmp/shardtrain_resize_test_" + std::to_string(::getpid());
    io::remove_tree(root_);
    io::make_directories(root_);
    // 600 texts of 5-20 words from a small alphabet, the same every run (a fixed linear congruential stream).
    const std::vector<std::string> words = {"red",   "green", "blue", "circle", "square", "triangle", "small",
                                            "large", "left",  "right", "top",   "bottom", "near",    "far"};
    uint64_t state = 12345;
    auto next = [&](uint64_t n) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 33) % n;
    };
    std::ofstream texts(root_ + "/train.jsonl");
    for (int i = 0; i < 600; ++i) {
      std::string text;
      for (uint64_t w = 0, n = 5 + next(16); w < n; ++w) text += (w ? " " : "") + words[next(words.size())];
      texts << nlohmann::json{{"text", text}}.dump() << "\n";
    }
    texts.close();
    const Outcome vocab = run(std::string(SHARDTRAIN_BIN) + " data vocab --out " + root_ + "/vocab.txt --size 64 " +
                              root_ + "/train.jsonl");
    ASSERT_EQ(vocab.status, 0) << vocab.output;
    std::ofstream(root_ + "/config.yaml") << "model: {flavor: llama-debug}\n";
  }
  static void TearDownTestSuite() { io::remove_tree(root_); }

  // `shardtrain train` of `steps` steps on `ranks` processes with `rows` rows a rank, checkpointing every step into
  // `dir`.
  static Outcome train(int steps, int ranks, int rows, const std::string& dir, const std::string& extra) {
    const std::string bin = SHARDTRAIN_BIN;
    return run(bin + " launch --nproc-per-node " + std::to_string(ranks) + " -- " + bin + " train " + root_ +
               "/config.yaml --data.vocab=" + root_ + "/vocab.txt --data.text=[" + root_ + "/train.jsonl]" +
               " --data.text_fields=[text] --data.packing=true --data.max_text_length=32 --data.cache_dir=" + root_ +
               "/cache --train.steps=" + std::to_string(steps) + " --train.grad_accum=1 --train.eval_interval=0" +
               " --optim.lr=3e-3 --optim.warmup_steps=2 --log.interval=1 --log.progress=lines --checkpoint.interval=1" +
               " --checkpoint.keep=0 --checkpoint.dir=" + dir + " --train.batch_size=" + std::to_string(rows) + " " +
               extra);
  }

  struct Leg {
    int ranks, rows;  // 12 rows a step in every leg: ranks x rows = 12
  };

  // The straight run (on 4 ranks) and the legs' run of one optimizer (`optim`: its config flags), a step a leg,
  // compared after every leg. `rounding`: how far apart two runs whose ranks sum gradients in another order may
  // end, as a fraction of what the steps moved the state.
  static void compare_legs(const std::string& name, const std::string& optim, double rounding,
                           const std::vector<Leg>& order) {
    const std::string straight = root_ + "/" + name + "-straight", legs = root_ + "/" + name + "-legs";
    const int steps = static_cast<int>(order.size());
    const Outcome whole = train(steps, 4, 3, straight, optim);
    ASSERT_EQ(whole.status, 0) << whole.output;
    const auto first = test::saved_state(straight + "/step-00000001", true);
    const double moved =
        max_difference(first, test::saved_state(straight + "/step-0000000" + std::to_string(steps), true));
    ASSERT_GT(moved, 1e-3) << "the straight run did not train";

    for (size_t i = 0; i < order.size(); ++i) {
      const int step = static_cast<int>(i) + 1;
      SCOPED_TRACE(name + ": leg " + std::to_string(step) + " on " + std::to_string(order[i].ranks) + " ranks");
      const std::string resume = i == 0 ? "" : " --resume --checkpoint.allow_changes=[train.batch_size]";
      const std::string stop = " --train.stop_at=" + std::to_string(step);
      const Outcome leg = train(steps, order[i].ranks, order[i].rows, legs, optim + stop + resume);
      ASSERT_EQ(leg.status, 0) << leg.output;
      if (i > 0) {
        EXPECT_NE(leg.output.find("at step " + std::to_string(step - 1) + " (another world size"), std::string::npos)
            << leg.output;
      }
      const std::string at = "/step-0000000" + std::to_string(step);
      const ckpt::TrainerState a = ckpt::read_trainer_state(straight + at), b = ckpt::read_trainer_state(legs + at);
      EXPECT_EQ(b.world_size, order[i].ranks);
      EXPECT_EQ(a.step, b.step);
      EXPECT_EQ(a.loader_step, b.loader_step);
      EXPECT_EQ(a.loader_consumed, b.loader_consumed);
      EXPECT_EQ(a.optimizer_steps, b.optimizer_steps);
      const auto expected = test::saved_state(straight + at, true), got = test::saved_state(legs + at, true);
      EXPECT_LE(max_difference(expected, got), rounding * moved) << "the steps moved the state by " << moved;
    }
  }

  static std::string root_;
};
std::string ResumeAtOtherSizes::root_;

// Measured: the legs end 6.7e-8 from the straight run (3e-6 of what the steps moved) with AdamW, 7.5e-9 with
// Adafactor, 6.5e-6 with AnyPrecision's bf16 state (2.8e-4: its moments round to bf16 at every step).
// AdamW over the whole chain, 4 -> 2 -> 1 -> 3 ranks; the other optimizers' state from 4 ranks to 3 (shards of
// uneven bounds on both sides).
TEST_F(ResumeAtOtherSizes, AdamWEqualsOneRunThrough) {
  compare_legs("adamw", "--optim.name=adamw", 1e-4, {{4, 3}, {2, 6}, {1, 12}, {3, 4}});
}

TEST_F(ResumeAtOtherSizes, AnyPrecisionAdamWWithItsCompensationEqualsOneRunThrough) {
  compare_legs("anyprecision", "--optim.name=anyprecision_adamw --optim.use_kahan_summation=true", 1e-3,
               {{4, 3}, {3, 4}});
}

TEST_F(ResumeAtOtherSizes, AdafactorWithItsFactorsEqualsOneRunThrough) {
  compare_legs("adafactor",
               "--optim.name=adafactor --optim.relative_step=true --optim.scale_parameter=true --optim.beta1=0.9",
               1e-4, {{4, 3}, {3, 4}});
}

}  // namespace
}  // namespace shardtrain
