// What a person at a terminal sees, checked in a real one: `shardtrain launch` of a 2-process `shardtrain train`
// inside tmux, the pane captured while it runs. Rank 0's progress bar is drawn in place at the bottom, moves between
// the periodic log lines, and is not interleaved with rank 1 (launch/launch.h [Note: progress through the
// launcher]). The same run with its output in a file has no carriage returns or escape codes. Skipped without tmux.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>

#include "train/train_harness.h"

namespace shardtrain {
namespace {

using test::Outcome;

class TerminalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = "/tmp/shardtrain_terminal_test_" + std::to_string(::getpid());
    const Outcome synth = test::write_flava_suite(root_);
    ASSERT_EQ(synth.status, 0) << synth.output;
  }
  static void TearDownTestSuite() { io::remove_tree(root_); }
  static std::string command(int steps) {
    return std::string(SHARDTRAIN_BIN) + " launch --nproc-per-node 2 -- " + SHARDTRAIN_BIN + " train " + root_ +
           "/config.yaml --train.steps=" + std::to_string(steps) + " --train.eval_interval=0 --log.interval=50 " +
           "--log.progress=auto";
  }
  static std::string root_;
};
std::string TerminalTest::root_;

// The step of a bar line "[rank0]: [####....] 24/150  16% ...", or -1.
int bar_step(const std::string& line) {
  if (line.rfind("[rank0]: [", 0) != 0) return -1;
  const size_t close = line.find("] ", 10);
  if (close == std::string::npos) return -1;
  return std::atoi(line.c_str() + close + 2);
}

TEST_F(TerminalTest, TheBarMovesInPlaceBetweenLogLines) {
  if (test::run("command -v tmux").status != 0) GTEST_SKIP() << "tmux is not installed";
  const std::string session = "shardtrain-" + std::to_string(::getpid());
  const std::string done = "RUN-ENDED-" + std::to_string(::getpid());
  ASSERT_EQ(test::run("tmux new-session -d -s " + session + " -x 200 -y 50 \"" + command(150) + "; echo " + done +
                      "; sleep 60\"").status, 0);
  std::set<int> steps_seen;
  bool bar_below_log_line = false, rank1_bar = false, marker = false, ended = false;
  std::string pane, last_bar;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (!ended && std::chrono::steady_clock::now() < deadline) {
    pane = test::run("tmux capture-pane -p -t " + session).output;
    ended = pane.find(done) != std::string::npos;
    std::string previous;
    for (size_t at = 0; at < pane.size();) {
      const size_t end = pane.find('\n', at);
      const std::string line = pane.substr(at, end == std::string::npos ? std::string::npos : end - at);
      at = end == std::string::npos ? pane.size() : end + 1;
      if (line.empty()) continue;
      const int step = bar_step(line);
      if (step > 0 && !ended) {
        steps_seen.insert(step);
        last_bar = line;
        bar_below_log_line |= previous.find("step 50/150  loss") != std::string::npos ||
                              previous.find("peak mem") != std::string::npos;
      }
      rank1_bar |= line.rfind("[rank1]: [", 0) == 0;
      marker |= line.find('\x1e') != std::string::npos;
      previous = line;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  test::run("tmux kill-session -t " + session);
  ASSERT_TRUE(ended) << pane;
  EXPECT_GE(steps_seen.size(), 3u) << "the bar did not move:\n" << pane;
  EXPECT_TRUE(bar_below_log_line) << "no bar under a log line:\n" << pane;
  EXPECT_FALSE(rank1_bar) << pane;
  EXPECT_FALSE(marker) << pane;
  EXPECT_NE(pane.find("step 150/150  loss"), std::string::npos) << pane;
  // The bar carries steps, percentage, elapsed<remaining, rates, the loss and peak memory.
  for (const char* part : {"/150", "%", "<", "it/s", "samples/s", "loss", "mem"}) {
    EXPECT_NE(last_bar.find(part), std::string::npos) << part << " in " << last_bar;
  }
}

TEST_F(TerminalTest, OutputToAFileHasNoControlCharacters) {
  const Outcome r = test::run(command(60));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step 50/60  loss"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos);
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos);
  EXPECT_EQ(r.output.find('\x1e'), std::string::npos);
}

}  // namespace
}  // namespace shardtrain
