// Pieces of the training loop in one process: the learning-rate schedule, TensorBoard event files, checkpoint
// directory bookkeeping and generator states, the console logger, the interval metrics and their log.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <fstream>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/trainer_state.h"
#include "shardtrain/data/pipeline/synth.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/io/files.h"
#include "shardtrain/log/log.h"
#include "train/event_writer.h"
#include "shardtrain/train/schedule.h"
#include "train/interval_metrics.h"
#include "train/metrics_log.h"
#include "train/training_data.h"
#include "support/scratch.h"

namespace shardtrain::train {
namespace {

TEST(LrSchedule, WarmupThenCosineOrLinearToTheFloor) {
  config::OptimConfig o;
  o.lr = 1.0, o.warmup_steps = 4, o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 104), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3, 104), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4, 104), 1.0);            // decay starts at the peak
  EXPECT_NEAR(learning_rate(o, 54, 104), 0.55, 1e-12);        // half way: the middle of [0.1, 1]
  EXPECT_NEAR(learning_rate(o, 104, 104), 0.1, 1e-12);
  o.schedule = config::LrSchedule::LINEAR;
  EXPECT_NEAR(learning_rate(o, 29, 104), 1.0 - 0.9 * 0.25, 1e-12);
  o.schedule = config::LrSchedule::CONSTANT;
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

// A checkpoint directory as save_checkpoint leaves it: files, then the manifest naming `run_id`.
void write_checkpoint(const std::string& path, int64_t step, const std::string& run_id) {
  io::make_directories(path + "/model");
  const std::string json = "{\"format\":\"shardtrain.checkpoint.v1\"}";
  io::write_file_atomic(path + "/trainer.json", std::vector<char>(json.begin(), json.end()));
  io::write_file_atomic(path + "/model/rank0.bin", std::vector<char>(1000 + static_cast<size_t>(step), 'a'));
  ckpt::Manifest m;
  m.run_id = run_id, m.step = step;
  m.files = ckpt::describe_files(path, ckpt::checkpoint_files(path));
  ckpt::write_manifest(path, m);
}

TEST(CheckpointDirectory, ListsCheckpointsAndPrunesOnlyItsOwnRun) {
  const std::string dir = "/tmp/shardtrain_ckpt_list_" + std::to_string(::getpid());
  io::remove_tree(dir);
  for (int64_t step : {10, 20, 30, 40}) write_checkpoint(dir + "/" + ckpt::step_directory_name(step), step, "mine");
  write_checkpoint(dir + "/step-00000025", 25, "another-run");  // written into the same directory meanwhile
  io::make_directories(dir + "/step-00000050.partial");         // a save that crashed
  io::make_directories(dir + "/step-00000060");                 // damaged since: no manifest
  EXPECT_EQ(ckpt::list_checkpoints(dir).size(), 6u);
  EXPECT_EQ(*ckpt::latest_checkpoint(dir), dir + "/step-00000060");
  EXPECT_EQ(ckpt::run_id_of(dir + "/step-00000025"), "another-run");
  EXPECT_EQ(ckpt::run_id_of(dir + "/step-00000060"), "");
  ckpt::prune_checkpoints(dir, 2, "mine");
  EXPECT_EQ(ckpt::list_checkpoints(dir), (std::vector<std::string>{dir + "/step-00000025", dir + "/step-00000030",
                                                                   dir + "/step-00000040", dir + "/step-00000060"}));
  EXPECT_FALSE(io::path_exists(dir + "/step-00000050.partial"));
  EXPECT_NE(ckpt::verify_files(dir + "/step-00000060").find("manifest.json: missing"), std::string::npos);
  io::remove_tree(dir);
}

// Every way a checkpoint's files can be wrong after the save is named by verification, with the file.
TEST(CheckpointManifest, VerificationNamesTheFileAndTheFault) {
  const std::string dir = "/tmp/shardtrain_ckpt_verify_" + std::to_string(::getpid());
  io::remove_tree(dir);
  const std::string a = dir + "/step-00000004", b = dir + "/step-00000008";
  write_checkpoint(a, 4, "run"), write_checkpoint(b, 8, "run");
  EXPECT_EQ(ckpt::verify_files(a), "");
  EXPECT_EQ(ckpt::read_manifest(a).files.size(), 2u);  // model/rank0.bin, trainer.json
  // Shared between two readers: each checks every other file, the first also that nothing was added.
  EXPECT_EQ(ckpt::verify_files(b, 0, 2) + ckpt::verify_files(b, 1, 2), "");

  auto bytes = io::read_file(b + "/model/rank0.bin");
  bytes[500] ^= 0x10;  // one flipped bit
  io::write_file_atomic(b + "/model/rank0.bin", bytes);
  EXPECT_NE(ckpt::verify_files(b).find("model/rank0.bin: checksum "), std::string::npos) << ckpt::verify_files(b);
  EXPECT_NE(ckpt::verify_files(b, 0, 2), "");  // the first reader's share holds it (sorted: model/ first)
  EXPECT_EQ(ckpt::verify_files(b, 1, 2), "");

  bytes.resize(100);  // truncated
  io::write_file_atomic(b + "/model/rank0.bin", bytes);
  EXPECT_NE(ckpt::verify_files(b).find("model/rank0.bin: 100 bytes, the manifest says 1008 (truncated)"),
            std::string::npos) << ckpt::verify_files(b);

  // The shard of another step, with its own (right) size: the checksum still differs.
  write_checkpoint(b, 8, "run");
  auto other = io::read_file(a + "/model/rank0.bin");
  other.resize(1008, 'a');
  other[0] = 'b';
  io::write_file_atomic(b + "/model/rank0.bin", other);
  EXPECT_NE(ckpt::verify_files(b).find("(damaged, or a file of another checkpoint)"), std::string::npos);

  write_checkpoint(b, 8, "run");
  io::write_file_atomic(b + "/model/stray.bin", {'x'});
  EXPECT_NE(ckpt::verify_files(b).find("model/stray.bin: not in the manifest"), std::string::npos);
  io::remove_tree(b + "/model/stray.bin");
  io::remove_tree(b + "/trainer.json");
  EXPECT_NE(ckpt::verify_files(b).find("trainer.json: missing"), std::string::npos);

  // A whole checkpoint copied under another step's name.
  io::remove_tree(b);
  write_checkpoint(b, 4, "run");
  EXPECT_NE(ckpt::verify_files(b).find("step 4, the directory's is 8"), std::string::npos);
  // Found by fuzz_checkpoint_meta: a size too large for any integer (parsed as a float, whose cast to int64 is
  // undefined behaviour) is refused as not an integer; so is one in trainer.json.
  {
    auto text = io::read_file(a + "/manifest.json");
    std::string json(text.begin(), text.end());
    const size_t at = json.find("\"size\": ") + 8;
    json.replace(at, json.find(',', at) - at, "127870266666666666666666666666666666666");
    io::write_file_atomic(a + "/manifest.json", std::vector<char>(json.begin(), json.end()));
    EXPECT_NE(ckpt::verify_files(a).find(" is not an integer"), std::string::npos) << ckpt::verify_files(a);
    EXPECT_THROW(ckpt::parse_trainer_state("{\"format\": \"shardtrain.checkpoint.v1\", \"step\": 1e300}", "t"),
                 std::runtime_error);
  }
  // A damaged manifest.
  auto manifest = io::read_file(a + "/manifest.json");
  manifest.resize(manifest.size() / 2);
  io::write_file_atomic(a + "/manifest.json", manifest);
  EXPECT_NE(ckpt::verify_files(a).find("manifest.json: "), std::string::npos);
  io::remove_tree(dir);
}

// Every line a sink received, with its level; the status line's last text.
struct RecordingSink : log::Sink {
  std::vector<std::pair<log::Level, std::string>> lines;
  std::string last_status;
  int status_calls = 0;
  void line(log::Level level, const std::string& text) override { lines.emplace_back(level, text); }
  void status(const std::string& text) override { last_status = text, ++status_calls; }
};

TEST(TrainingData, ASourceSmallerThanOneGlobalBatchIsWarnedAbout) {
  const std::string dir = "/tmp/shardtrain_small_data_" + std::to_string(::getpid());
  io::remove_tree(dir);
  data::SynthOptions o;
  o.out = dir, o.image_text_samples = 6, o.text_samples = 40, o.image_samples = 16, o.eval_samples = 16;
  o.samples_per_shard = 64, o.image_size = 32;
  data::write_synth_dataset(o);
  TrainingData d;
  d.sources[0] = std::make_shared<data::SampleSource>(std::vector<std::string>{dir + "/image_text"},
                                                      data::SampleKind::IMAGE_TEXT);
  d.sources[1] = std::make_shared<data::SampleSource>(std::vector<std::string>{dir + "/text"}, data::SampleKind::TEXT);
  d.options.world = 2, d.options.batch_size = 4;
  auto sink = std::make_shared<RecordingSink>();
  describe_data(d, log::Logger(sink, 0, {log::Level::INFO}));
  std::vector<std::string> warnings;
  for (const auto& [level, text] : sink->lines) {
    if (level == log::Level::WARNING) warnings.push_back(text);
  }
  // 6 image-text samples < 2 x 4; 40 text samples are enough.
  ASSERT_EQ(warnings.size(), 1u) << ::testing::PrintToString(sink->lines);
  EXPECT_EQ(warnings[0], "image_text data: 6 samples are fewer than one global batch (2 ranks x train.batch_size 4 = 8): "
                         "every batch of it repeats samples");
  io::remove_tree(dir);
}

TEST(Logger, FiltersByLevelAndRank) {
  auto sink = std::make_shared<RecordingSink>();
  const log::Logger rank0(sink, 0, {log::Level::INFO});
  const log::Logger rank1(sink, 1, {log::Level::INFO});
  rank0.debug("hidden");
  rank0.info("shown");
  rank0.warning("warned");
  rank1.info("rank 1 says nothing by default");
  rank1.info_every_rank("rank 1: from every rank");
  rank1.status("no bar on rank 1");
  rank0.status("[###...]");
  ASSERT_EQ(sink->lines.size(), 3u);
  EXPECT_EQ(sink->lines[0], std::make_pair(log::Level::INFO, std::string("shown")));
  EXPECT_EQ(sink->lines[1], std::make_pair(log::Level::WARNING, std::string("warned")));
  EXPECT_EQ(sink->lines[2].second, "rank 1: from every rank");
  EXPECT_EQ(sink->last_status, "[###...]");
  EXPECT_EQ(sink->status_calls, 1);
  const log::Logger quiet(sink, 0, {log::Level::ERROR});
  quiet.warning("dropped");
  EXPECT_EQ(sink->lines.size(), 3u);
  EXPECT_FALSE(quiet.writes(log::Level::WARNING));
  EXPECT_TRUE(quiet.writes(log::Level::ERROR));
  log::Logger().error("a logger without a sink is silent");
  const log::Logger everyone(sink, 2, {log::Level::INFO, /*every_rank=*/true});
  everyone.info("rank 2 too");
  EXPECT_EQ(sink->lines.back().second, "rank 2 too");
}

// Three steps of one rank: means over the steps that had each loss, a skipped (float16 overflow) step's norm left
// out, throughput over the timed steps only.
TEST(IntervalMetrics, NamedSumsReduceToTheLoggedMeans) {
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::DistEnv{});
  IntervalSums sums;
  StepTotals a;
  a.loss = 3, a.parts = {{"mlm", 2.0}}, a.grad_norm = 1, a.texts = 8, a.flops = 1e12, a.seconds = 1;
  StepTotals b = a;
  b.loss = 1, b.parts = {{"mlm", 4.0}, {"itm", 0.5}}, b.grad_norm = INFINITY, b.stepped = false;
  StepTotals c = a;
  c.loss = 2, c.grad_norm = 3, c.seconds = 3;
  sums.add(a, /*timed=*/false);
  sums.add(b, true);
  sums.add(c, true);
  const IntervalMetrics m = reduce_interval(sums, {"mlm", "itm", "cls"}, 0.25, 2.0, pg.world(), at::Device(at::kCPU));
  EXPECT_DOUBLE_EQ(m.loss, 2.0);
  EXPECT_DOUBLE_EQ(m.parts.at("mlm"), (2.0 + 4.0 + 2.0) / 3);
  EXPECT_DOUBLE_EQ(m.parts.at("itm"), 0.5);
  EXPECT_EQ(m.parts.count("cls"), 0u);
  EXPECT_DOUBLE_EQ(m.grad_norm, (1.0 + 3.0) / 3);  // the skipped step adds nothing, the mean is over every step
  EXPECT_DOUBLE_EQ(m.texts_per_second, 16.0 / 4.0);
  EXPECT_DOUBLE_EQ(m.items_per_second, 4.0);
  EXPECT_DOUBLE_EQ(m.tflops_per_rank, 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(m.mfu, 0.25);
  EXPECT_EQ(m.peak_memory_gib, std::vector<double>{0.25});
}

TEST(MetricsLog, LinesThroughTheLoggerAndTheTasksLossesAsColumns) {
  const std::string dir = "/tmp/shardtrain_metrics_log_" + std::to_string(::getpid());
  io::remove_tree(dir);
  auto sink = std::make_shared<RecordingSink>();
  config::LogConfig lc;
  lc.dir = dir, lc.tensorboard = false, lc.progress = config::Progress::BAR;
  {
    MetricsLog log(lc, log::Logger(sink, 0), /*leader=*/true, 100, 0, {"mlm", "itm"});
    log.step_done(10, 2.5);
    EXPECT_NE(sink->last_status.find("10/100"), std::string::npos) << sink->last_status;
    IntervalMetrics m;
    m.step = 10, m.steps = 10, m.loss = 2.5, m.parts = {{"mlm", 2.0}}, m.lr = 1e-3, m.grad_norm = 0.5;
    m.items_per_second = NAN, m.peak_memory_gib = {0.125, 0.25};
    log.record(m);
    log.record_eval(10, {{"r1", 0.5}});
    IntervalMetrics last = m;  // an interval shorter than log.interval (the run's last 4 steps) says so
    last.step = 14, last.steps = 4;
    log.record(last);
    log.finish();
  }
  ASSERT_EQ(sink->lines.size(), 3u);
  EXPECT_EQ(sink->lines[0].second, "step 10/100  loss 2.5000  lr 0.001  grad_norm 0.5  mlm 2.0000  "
                                   "(throughput after warm-up)  peak mem 0.25 GiB (0.125 0.25)");
  EXPECT_EQ(sink->lines[1].second, "eval step 10  r1 0.5");
  EXPECT_EQ(sink->lines[2].second.rfind("step 14/100  loss 2.5000 (the mean of 4 steps)  lr 0.001", 0), 0u)
      << sink->lines[2].second;
  EXPECT_EQ(sink->last_status, "");  // finish() removes the bar
  std::ifstream csv(dir + "/metrics.csv");
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  EXPECT_EQ(header, "step,loss,lr,grad_norm,items_per_s,texts_per_s,images_per_s,tflops_per_rank,mfu,peak_memory_gib,"
                    "peak_memory_gib_by_rank,mlm,itm");
  EXPECT_EQ(row, "10,2.5,0.001,0.5,,0,0,0,0,0.25,0.125;0.25,2,");  // the first interval's row
  io::remove_tree(dir);
}

// A log directory on a full disk (a 64 KiB tmpfs filled up; needs root to mount) and one that cannot be made:
// each file is dropped with one warning giving the system's reason, and logging goes on without it.
TEST(MetricsLog, AFullDiskOrAMissingDirectoryWarnsOnceAndGoesOn) {
  const testing::TempDir dir("shardtrain_full_disk_");
  const std::string mnt = dir.path + "/full";
  const testing::SmallDisk disk(mnt, "64k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  io::write_file_atomic(mnt + "/filler", std::vector<char>(60 * 1024, 'x'));
  for (int i = 0; io::file_size(mnt + "/filler") > 0 && i < 64; ++i) {  // the last blocks too
    try {
      io::write_file_atomic(mnt + "/filler" + std::to_string(i), std::vector<char>(4096, 'x'));
    } catch (const std::runtime_error&) {
      break;
    }
  }
  auto sink = std::make_shared<RecordingSink>();
  config::LogConfig lc;
  lc.dir = mnt + "/log", lc.progress = config::Progress::LINES;
  {
    MetricsLog log(lc, log::Logger(sink, 0), /*leader=*/true, 100, 0, {"mlm"});
    IntervalMetrics m;
    m.step = 10, m.loss = 2.5, m.items_per_second = NAN, m.peak_memory_gib = {0.25};
    for (int i = 0; i < 3; ++i) log.record(m), log.record_eval(10, {{"r1", 0.5}});
  }
  int warnings = 0, lines = 0;
  std::string text;
  for (const auto& [level, line] : sink->lines) {
    if (level == log::Level::WARNING) ++warnings, text += line + "\n";
    if (line.rfind("step 10/100", 0) == 0) ++lines;
  }
  EXPECT_EQ(lines, 3);  // the console lines go on
  EXPECT_GE(warnings, 1);
  EXPECT_LE(warnings, 3);  // at most one per file: metrics.csv, eval.csv, events
  EXPECT_NE(text.find("No space left on device"), std::string::npos) << text;
  EXPECT_NE(text.find("training goes on without"), std::string::npos) << text;

  // log.dir under a regular file: it cannot be made.
  const std::string file = "/tmp/shardtrain_not_a_dir_" + std::to_string(::getpid());
  io::write_file_atomic(file, {'x'});
  auto sink2 = std::make_shared<RecordingSink>();
  lc.dir = file + "/log";
  {
    MetricsLog log(lc, log::Logger(sink2, 0), /*leader=*/true, 100, 0, {"mlm"});
    IntervalMetrics m;
    m.step = 10, m.loss = 2.5, m.items_per_second = NAN, m.peak_memory_gib = {0.25};
    log.record(m), log.record_eval(10, {{"r1", 0.5}});
  }
  io::remove_tree(file);
  ASSERT_EQ(sink2->lines.size(), 3u);
  EXPECT_EQ(sink2->lines[0].first, log::Level::WARNING);
  EXPECT_NE(sink2->lines[0].second.find("Not a directory"), std::string::npos) << sink2->lines[0].second;
}

// A checkpoint keeps the default generators' states: after a load, the same random numbers come again.
TEST(CheckpointRng, GeneratorStatesComeBack) {
  const std::string dir = "/tmp/shardtrain_ckpt_rng_" + std::to_string(::getpid());
  io::remove_tree(dir);
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::DistEnv{});
  auto linear = std::make_shared<torch::nn::LinearImpl>(3, 2);
  torch::optim::AdamW optimizer(linear->parameters(), torch::optim::AdamWOptions(1e-3));
  const ckpt::CheckpointModel model{linear, &optimizer, /*sharded=*/false, {}};
  at::manual_seed(7);
  ckpt::TrainerState state;
  state.step = 1, state.flavor = "linear";
  const std::string path = ckpt::save_checkpoint(dir, state, model, pg.world());
  const at::Tensor first = at::rand({4});
  at::manual_seed(8);
  ckpt::load_checkpoint(path, model, pg.world());
  EXPECT_TRUE(at::equal(at::rand({4}), first));
  io::remove_tree(dir);
}

}  // namespace
}  // namespace shardtrain::train
