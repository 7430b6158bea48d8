// Pieces of the training loop that need no process group: the learning-rate schedule, TensorBoard event files,
// checkpoint directory bookkeeping.
#include <gtest/gtest.h>

#include <unistd.h>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/io/files.h"
#include "shardtrain/train/event_writer.h"
#include "shardtrain/train/schedule.h"

namespace shardtrain::train {
namespace {

TEST(Schedule, WarmupThenCosineOrLinearToTheFloor) {
  config::OptimConfig o;
  o.lr = 1.0, o.warmup_steps = 4, o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 104), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3, 104), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4, 104), 1.0);            // decay starts at the peak
  EXPECT_NEAR(learning_rate(o, 54, 104), 0.55, 1e-12);        // half way: the middle of [0.1, 1]
  EXPECT_NEAR(learning_rate(o, 104, 104), 0.1, 1e-12);
  o.schedule = config::Schedule::LINEAR;
  EXPECT_NEAR(learning_rate(o, 29, 104), 1.0 - 0.9 * 0.25, 1e-12);
  o.schedule = config::Schedule::CONSTANT;
  EXPECT_DOUBLE_EQ(learning_rate(o, 80, 104), 1.0);
}

TEST(EventWriter, Crc32cAndRecordsReadBack) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);  // the standard CRC-32C check value
  const std::string dir = "/tmp/shardtrain_events_" + std::to_string(::getpid());
  io::remove_tree(dir);
  std::string path;
  {
    EventWriter w(dir);
    w.add_scalar("train/loss", 2.5, 10);
    w.add_scalar("train/loss", 1.5, 20);
    path = w.path();
  }
  const auto records = read_tfrecords(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  float value;
  std::memcpy(&value, records[2].data() + records[2].size() - 4, 4);  // simple_value is the last field
  EXPECT_FLOAT_EQ(value, 1.5f);
  // A flipped byte is found by the CRC.
  auto bytes = io::read_file(path);
  bytes[bytes.size() - 6] ^= 1;
  io::write_file_atomic(path, bytes);
  EXPECT_THROW(read_tfrecords(path), std::runtime_error);
  io::remove_tree(dir);
}

TEST(CheckpointDirectory, ListsCompleteOnesAndPrunes) {
  const std::string dir = "/tmp/shardtrain_ckpt_list_" + std::to_string(::getpid());
  io::remove_tree(dir);
  for (int64_t step : {10, 20, 30, 40}) {
    const std::string path = dir + "/" + ckpt::step_directory_name(step);
    io::make_directories(path);
    const std::string json = "{\"format\":\"shardtrain.checkpoint.v1\"}";
    io::write_file_atomic(path + "/trainer.json", std::vector<char>(json.begin(), json.end()));
  }
  io::make_directories(dir + "/step-00000050.partial");  // a save that crashed
  io::make_directories(dir + "/step-00000060");          // no trainer.json: not complete
  EXPECT_EQ(ckpt::list_checkpoints(dir).size(), 4u);
  EXPECT_EQ(*ckpt::latest_checkpoint(dir), dir + "/step-00000040");
  ckpt::prune_checkpoints(dir, 2);
  EXPECT_EQ(ckpt::list_checkpoints(dir), (std::vector<std::string>{dir + "/step-00000030", dir + "/step-00000040"}));
  EXPECT_FALSE(io::path_exists(dir + "/step-00000050.partial"));
  EXPECT_THROW(ckpt::read_trainer_state(dir + "/step-00000060"), std::runtime_error);
  io::remove_tree(dir);
}

}  // namespace
}  // namespace shardtrain::train
