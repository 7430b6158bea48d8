// The config tree: YAML sections and overrides, errors that name the key or value and what was expected, and the
// keys of Accelerate's config files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "shardtrain/config/config.h"
#include "shardtrain/data/formats/image.h"
#include "shardtrain/io/files.h"
#include "support/expect_error.h"

namespace shardtrain::config {
namespace {

using shardtrain::testing::expect_error;

TEST(Config, ResumeIsFalseTrueOrAuto) {
  EXPECT_EQ(parse_config("checkpoint: {dir: d, resume: auto}\n", "x.yaml").checkpoint.resume, Resume::AUTO);
  EXPECT_EQ(parse_config("checkpoint: {dir: d, resume: true}\n", "x.yaml").checkpoint.resume, Resume::ALWAYS);
  EXPECT_EQ(parse_config("checkpoint: {dir: d}\n", "x.yaml").checkpoint.resume, Resume::NEVER);
  EXPECT_TRUE(parse_config("", "x.yaml").train.tf32);  // on by default, as the FLAVA post trains
  EXPECT_FALSE(parse_config("", "x.yaml", {"--train.tf32=false"}).train.tf32);
  const Config c = parse_config("checkpoint: {dir: d, resume: auto}\nlaunch: {max_restarts: 3, preempt_grace: 5}\n",
                                "x.yaml");
  const Config again = parse_config(to_yaml(c), "again.yaml");  // written back as it reads
  EXPECT_EQ(again.checkpoint.resume, Resume::AUTO);
  EXPECT_EQ(again.launch.max_restarts, 3);
  EXPECT_EQ(again.launch.preempt_grace, 5);
}

// The keys whose values differ between a saved config and the run's: equal values however written (0.9 and
// 0.90000000000000002, block or flow lists), a key an older config lacks counting as its default.
TEST(Config, ChangedKeysComparesValuesNotSpellings) {
  Config c;
  EXPECT_TRUE(changed_keys(to_yaml(c), c).empty());
  EXPECT_TRUE(changed_keys("optim:\n  betas:\n    - 0.90000000000000002\n    - 0.999\n", c).empty());
  c.optim.betas = {0.9, 0.95};
  c.model.overrides = {{"layers", 2}};
  const auto changes = changed_keys("model: {flavor: flava-debug}\noptim: {betas: [0.9, 0.999]}\n", c);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].path, "model.overrides");
  EXPECT_EQ(changes[0].before, "(absent)");
  EXPECT_EQ(changes[0].after, "{layers: 2}");
  EXPECT_EQ(changes[1].path, "optim.betas");
  EXPECT_EQ(changes[1].before, "[0.9, 0.999]");
  EXPECT_EQ(changes[1].after, "[0.9, 0.95]");
  EXPECT_THROW(changed_keys("a: [unclosed", c), ConfigError);
}

// What a person reads: numbers in their shortest form that reads back the same, and each enumeration's values
// beside it when annotated; both read back to the same tree.
TEST(Config, YamlShowsShortNumbersAndTheChoices) {
  Config c;
  c.optim.lr = 3e-4;
  const std::string plain = to_yaml(c);
  EXPECT_NE(plain.find("  lr: 0.0003\n"), std::string::npos) << plain;
  EXPECT_NE(plain.find("    - 0.9\n    - 0.999\n"), std::string::npos) << plain;
  EXPECT_NE(plain.find("  min_lr_ratio: 0.1\n"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("00000000000"), std::string::npos) << plain;  // no 0.90000000000000002
  EXPECT_EQ(plain.find('#'), std::string::npos) << plain;
  const std::string annotated = to_yaml(c, /*annotated=*/true);
  EXPECT_NE(annotated.find("  name: adamw  # adamw | anyprecision_adamw | adafactor | sgd\n"), std::string::npos)
      << annotated;
  EXPECT_NE(annotated.find("  on_nonfinite: skip  # stop | skip | rollback\n"), std::string::npos) << annotated;
  EXPECT_EQ(to_yaml(parse_config(annotated, "annotated.yaml")), plain);
  EXPECT_EQ(parse_config(plain, "plain.yaml").optim.betas, c.optim.betas);
}

TEST(Config, EmptyFileIsTheDefaults) {
  const Config c = parse_config("", "empty.yaml");
  EXPECT_EQ(c.model.flavor, "flava-debug");
  EXPECT_EQ(c.parallel.strategy, parallel::Strategy::FULL_SHARD);
  EXPECT_EQ(c.train.steps, 1000);
  // The config's pixel limit repeats the decoder's (config.h stays free of the data headers): the same number.
  EXPECT_EQ(c.data.max_image_pixels, data::kDefaultMaxImagePixels);
}

TEST(Config, SectionsAndOverridesSetTheSameTree) {
  const Config a = parse_config(R"(
model:
  flavor: bert-base-uncased
parallel:
  strategy: shard_grad_op
  mixed_precision: bf16
  layer_classes: [BertLayer]
optim:
  betas: [0.9, 0.95]
  lr: 3e-4
data:
  mix:
    text: 0.5
train:
  steps: 20
  max_grad_norm: 0
log:
  progress: lines
)",
                                "a.yaml");
  const Config b = parse_config("", "b.yaml",
                                {"--model.flavor=bert-base-uncased", "--parallel.strategy=SHARD_GRAD_OP",
                                 "--parallel.mixed_precision=bf16", "--parallel.layer_classes=[BertLayer]",
                                 "--optim.betas=[0.9,0.95]", "optim.lr=3e-4", "--data.mix.text=0.5",
                                 "--train.steps=20", "--train.max_grad_norm=0", "--log.progress=lines"});
  EXPECT_EQ(to_yaml(a), to_yaml(b));
  EXPECT_EQ(a.model.flavor, "bert-base-uncased");
  EXPECT_EQ(a.parallel.strategy, parallel::Strategy::SHARD_GRAD_OP);
  EXPECT_EQ(a.parallel.mixed_precision, parallel::Precision::BF16);
  EXPECT_EQ(a.parallel.layer_classes, std::vector<std::string>{"BertLayer"});
  EXPECT_EQ(a.optim.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_DOUBLE_EQ(a.optim.lr, 3e-4);
  EXPECT_DOUBLE_EQ(a.data.mix.text, 0.5);
  EXPECT_EQ(a.train.steps, 20);
  EXPECT_EQ(a.log.progress, Progress::LINES);
}

TEST(Config, OverridesComeAfterTheFile) {
  const Config c = parse_config("train:\n  steps: 5\n", "c.yaml", {"--train.steps=7"});
  EXPECT_EQ(c.train.steps, 7);
}

TEST(Config, ToYamlReadsBackEqual) {
  Config c;
  c.model.flavor = "t5-small";
  c.data.image_mean = {0.1, 0.2, 0.30000000000000004};
  c.optim.no_decay = {"bias$", "norm"};
  c.parallel.backward_prefetch = Prefetch::BACKWARD_POST;
  c.checkpoint.dir = "ckpt";
  c.model.overrides = {{"layers", 4}, {"norm_eps", 1e-6}};
  c.data.text_fields = {"#1 String", "#2 String"};  // GLUE's column names: '#' starts a YAML comment unquoted
  c.data.labels = {"not_equivalent", "equivalent"};
  const std::string yaml = to_yaml(c);
  const Config back = parse_config(yaml, "dump.yaml");
  EXPECT_EQ(to_yaml(back), yaml);
  EXPECT_EQ(back.model.overrides, c.model.overrides);
  EXPECT_EQ(back.data.image_mean, c.data.image_mean);
  EXPECT_EQ(back.optim.no_decay, c.optim.no_decay);
  EXPECT_EQ(back.data.text_fields, c.data.text_fields);
  EXPECT_EQ(back.data.labels, c.data.labels);
  for (const auto& key : key_paths()) {
    const auto leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key;
  }
}

TEST(Config, UnknownKeyNamesThePathAndTheClosestKey) {
  expect_error<ConfigError>([] { parse_config("train:\n  stepz: 5\n", "x.yaml"); },
                            {"x.yaml:2", "unknown key 'train.stepz'", "did you mean 'train.steps'"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.weight_decy=0.1"}); },
                            {"unknown key 'optim.weight_decy'", "'optim.weight_decay'"});
  expect_error<ConfigError>([] { parse_config("paralel:\n  strategy: ddp\n", "x.yaml"); },
                            {"x.yaml:1", "unknown key 'paralel'"});
  expect_error<ConfigError>([] { parse_config("fsdp_config:\n  fsdp_sharding_stratgy: 1\n", "x.yaml"); },
                            {"x.yaml:2", "fsdp_config.fsdp_sharding_stratgy", "fsdp_config.fsdp_sharding_strategy"});
  // YAML's complex keys (the fuzzer's find: yaml-cpp's conversion threw its own exception type).
  expect_error<ConfigError>([] { parse_config("train:\n  ? {steps: 5}\n  : 3\n", "x.yaml"); },
                            {"x.yaml:2", "a key of train is a mapping, expected a name"});
}

TEST(Config, BadValueNamesTheValueAndWhatWasExpected) {
  expect_error<ConfigError>([] { parse_config("train:\n  steps: many\n", "x.yaml"); },
                            {"x.yaml:2", "train.steps", "'many'", "an integer"});
  expect_error<ConfigError>([] { parse_config("parallel:\n  strategy: zero3\n", "x.yaml"); },
                            {"parallel.strategy", "'zero3'", "one of full_shard, shard_grad_op"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--train.device=tpu"}); },
                            {"train.device", "'tpu'", "one of auto, cpu, cuda"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--parallel.activation_checkpointing_every=0"}); },
                            {"parallel.activation_checkpointing_every", "0", "1 or more"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--parallel.wrap=layers"}); },
                            {"parallel.wrap", "'layers'", "one of transformer, size, none"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.betas=[0.9]"}); },
                            {"optim.betas", "two values"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--data.mlm_probability=1.5"}); },
                            {"data.mlm_probability", "1.5", "probability"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--log.csv=maybe"}); },
                            {"log.csv", "'maybe'", "true or false"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.no_decay=[\"(\"]"}); },
                            {"optim.no_decay", "'('", "regular expression"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--checkpoint.resume=true"}); },
                            {"checkpoint.resume", "checkpoint.dir"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--checkpoint.dir=d", "--checkpoint.resume=maybe"}); },
                            {"checkpoint.resume", "'maybe'", "false, true, auto"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--parallel.timeout=0.5"}); },
                            {"parallel.timeout", "0.5", "at least 1 (seconds)"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--launch.max_restarts=-1"}); },
                            {"launch.max_restarts", "-1", "0 or more"});
  expect_error<ConfigError>([] { parse_config("train:\n  memory_limit: 40 gigs\n", "x.yaml"); },
                            {"x.yaml:2", "train.memory_limit", "'40 gigs'", "40GiB"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--train.memory_budget=-1GiB"}); },
                            {"train.memory_budget", "'-1GiB'", "a positive number with a unit"});
  EXPECT_EQ(parse_config("train:\n  memory_limit: 1.5GiB\n", "x.yaml").train.memory_limit, 1536LL << 20);
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.name=adam"}); },
                            {"optim.name", "'adam'", "one of adamw, anyprecision_adamw, adafactor, sgd"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.name=adafactor", "--optim.decay_rate=0.8"}); },
                            {"optim.decay_rate", "0.8", "negative"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.warmup_init=true"}); },
                            {"optim.warmup_init", "optim.relative_step: true"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.adafactor_eps=[1e-30]"}); },
                            {"optim.adafactor_eps", "1 values", "two values [eps1, eps2]"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.beta1=1"}); }, {"optim.beta1", "in [0, 1)"});
  EXPECT_EQ(parse_config("train: {task: classify}\n", "x.yaml", {}).model.task, "classify");
  EXPECT_EQ(parse_config("", "x.yaml", {"--train.task=seq2seq", "--model.task=seq2seq"}).model.task, "seq2seq");
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--train.task=seq2seq", "--model.task=classify"}); },
                            {"train.task", "'seq2seq'", "model.task: 'classify'", "give one of them"});
  {
    const Config a = parse_config("optim: {name: adafactor, relative_step: true, scale_parameter: true, beta1: 0.9}\n",
                                  "x.yaml", {});
    EXPECT_EQ(a.optim.name, OptimizerKind::ADAFACTOR);
    EXPECT_TRUE(a.optim.relative_step && a.optim.scale_parameter);
    EXPECT_DOUBLE_EQ(a.optim.beta1, 0.9);
    EXPECT_EQ(a.optim.adafactor_eps, (std::vector<double>{1e-30, 1e-3}));
  }
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.momentum=1"}); },
                            {"optim.momentum", "1", "in [0, 1)"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.nesterov=true", "--optim.momentum=0"}); },
                            {"optim.nesterov", "a positive optim.momentum"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--optim.momentum_dtype=int8"}); },
                            {"optim.momentum_dtype", "'int8'", "float32, bfloat16, float16"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--model.dtype=fp16"}); },
                            {"model.dtype", "'float16'", "loss scaling"});
  expect_error<ConfigError>(
      [] { parse_config("", "x.yaml", {"--model.dtype=bf16", "--parallel.mixed_precision=bf16"}); },
      {"parallel.mixed_precision", "'bf16' with model.dtype: bfloat16", "no (the weights themselves"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--model.overrides=[4]"}); },
                            {"model.overrides", "a mapping of names to numbers"});
  expect_error<ConfigError>([] { parse_config("model:\n  overrides: {layers: many}\n", "x.yaml"); },
                            {"x.yaml:2", "model.overrides", "'many'", "a number"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--data.text_fields=[a, b, c]"}); },
                            {"data.text_fields", "3 fields", "one (a text) or two (a sentence pair)"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"--data.labels=[yes, no, yes]"}); },
                            {"data.labels", "'yes' twice", "distinct class names"});
  expect_error<ConfigError>([] { parse_config("train: [1, 2]\n", "x.yaml"); }, {"x.yaml:1", "train must be a mapping"});
  expect_error<ConfigError>([] { parse_config("train:\n  steps: [1\n", "x.yaml"); }, {"x.yaml", "not valid YAML"});
  expect_error<ConfigError>([] { parse_config("", "x.yaml", {"train.steps"}); }, {"--section.key=value"});
  expect_error<ConfigError>([] { load_config("/nonexistent/config.yaml"); }, {"/nonexistent/config.yaml"});
}

// What `accelerate config` writes for an FSDP job.
// A DeepSpeed config (ds_config.json, as Hugging Face Trainer's --deepspeed takes it), on its own or named by
// Accelerate's deepspeed_config_file: ZeRO's stage, offload, precision, micro-batch, accumulation, clipping, optimizer
// and scheduler become shardtrain's keys; "auto" keeps shardtrain's value; DeepSpeed's tuning knobs are listed as
// without effect, with the reason; a key with no counterpart, and values shardtrain cannot run, are refused by name.
TEST(Config, DeepSpeedConfigsMapOntoTheKeys) {
  const std::string dir = "/tmp/shardtrain_ds_config_" + std::to_string(::getpid());
  io::make_directories(dir);
  const std::string ds = R"({
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true,
    "reduce_bucket_size": "auto"
  },
  "bf16": {"enabled": true},
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0.5,
  "train_batch_size": "auto",
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100,
                                                     "warmup_max_lr": "auto", "warmup_min_lr": 0}},
  "steps_per_print": 5,
  "wall_clock_breakdown": false
})";
  std::ofstream(dir + "/ds_config.json") << ds;
  auto expect_mapped = [](const Config& c) {
    EXPECT_EQ(c.parallel.strategy, parallel::Strategy::SHARD_GRAD_OP);
    EXPECT_EQ(c.parallel.offload, parallel::Offload::CPU);
    EXPECT_EQ(c.parallel.mixed_precision, parallel::Precision::BF16);
    EXPECT_EQ(c.train.batch_size, 4);
    EXPECT_EQ(c.train.grad_accum, 2);
    EXPECT_DOUBLE_EQ(c.train.max_grad_norm, 0.5);
    EXPECT_EQ(c.optim.name, OptimizerKind::ADAMW);
    EXPECT_DOUBLE_EQ(c.optim.lr, 2e-4);
    EXPECT_EQ(c.optim.betas, (std::vector<double>{0.9, 0.95}));
    EXPECT_DOUBLE_EQ(c.optim.eps, 1e-6);
    EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
    EXPECT_EQ(c.optim.schedule, LrSchedule::LINEAR);
    EXPECT_DOUBLE_EQ(c.optim.min_lr_ratio, 0);
    EXPECT_EQ(c.optim.warmup_steps, 10);
    EXPECT_EQ(c.train.steps, 100);
    EXPECT_EQ(c.log.interval, 5);
    std::string unused;
    for (const auto& u : c.unused_keys) unused += u + "\n";
    for (const char* key : {"zero_optimization.offload_optimizer.pin_memory: no effect here",
                            "zero_optimization.overlap_comm: no effect here (DeepSpeed's communication tuning",
                            "wall_clock_breakdown: no effect here"}) {
      EXPECT_NE(unused.find(key), std::string::npos) << key << "\n" << unused;
    }
    EXPECT_EQ(unused.find("reduce_bucket_size"), std::string::npos) << unused;  // "auto": nothing to say
  };
  // On its own, the rest of the run from overrides; and through Accelerate's config, beside its other keys.
  expect_mapped(load_config(dir + "/ds_config.json", {"--model.flavor=llama-debug"}));
  std::ofstream(dir + "/accelerate.yaml") << "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: "
                                          << dir << "/ds_config.json\n  zero3_init_flag: false\nnum_processes: 2\n";
  const Config through = load_config(dir + "/accelerate.yaml");
  expect_mapped(through);
  EXPECT_EQ(through.launch.num_processes, 2);
  EXPECT_EQ(to_yaml(through).find("unused"), std::string::npos);  // not a key of the YAML
  // ZeRO-3 with both offloads to NVMe; DeepSpeed's Adam (AdamW mode) and the old cpu_offload switch.
  const Config three = parse_config(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}, "offload_param": {"device": "nvme"}},
      "optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})", "ds.json");
  EXPECT_EQ(three.parallel.strategy, parallel::Strategy::FULL_SHARD);
  EXPECT_EQ(three.parallel.offload, parallel::Offload::NVME);
  EXPECT_EQ(three.parallel.nvme_path, "/local_nvme");
  EXPECT_EQ(parse_config(R"({"zero_optimization": {"stage": 1, "cpu_offload": true}})", "ds.json").parallel.offload,
            parallel::Offload::CPU);
  EXPECT_EQ(parse_config(R"({"zero_optimization": {"stage": 0}})", "ds.json").parallel.strategy,
            parallel::Strategy::DDP);
  EXPECT_TRUE(parse_config(R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": true}})",
                           "ds.json").parallel.activation_offload);
  // Refused, named: a key with no counterpart, a stage DeepSpeed lacks, optimizers and schedules shardtrain lacks.
  expect_error<ConfigError>([] { parse_config(R"({"train_batch_size": 8, "amp": {"enabled": true}})", "ds.json"); },
                            {"ds.json", "DeepSpeed's 'amp.enabled' has no counterpart"});
  expect_error<ConfigError>([] { parse_config(R"({"zero_optimization": {"stage": 4}})", "ds.json"); },
                            {"zero_optimization.stage", "'4'", "a ZeRO stage"});
  expect_error<ConfigError>(
      [] { parse_config(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})", "ds.json"); },
      {"optimizer.type", "'Lamb'", "Adam, AdamW, SGD"});
  expect_error<ConfigError>(
      [] { parse_config(R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle"}})", "ds.json"); },
      {"scheduler.type", "'OneCycle'"});
  expect_error<ConfigError>(
      [] { parse_config(R"({"train_batch_size": 8, "optimizer": {"params": {"adam_w_mode": false}}})", "ds.json"); },
      {"adam_w_mode", "L2"});
  expect_error<ConfigError>([&] { load_config(dir + "/missing.yaml"); }, {"cannot read"});
  std::ofstream(dir + "/bad.yaml") << "deepspeed_config:\n  deepspeed_config_file: " << dir << "/nothing.json\n";
  expect_error<ConfigError>([&] { load_config(dir + "/bad.yaml"); },
                            {"deepspeed_config.deepspeed_config_file", "cannot read the DeepSpeed config", "nothing.json"});
  io::remove_tree(dir);
}

// The pipeline's keys: its schedule's shape (microbatches pp_size unless given), and sizes it cannot run refused
// before any worker starts, naming the numbers and what would work.
TEST(Config, PipelineKeysDescribeASchedule) {
  const Config c = parse_config("parallel: {pp_size: 4, pp_schedule: interleaved_1f1b, pp_stages_per_rank: 2, "
                                "pp_microbatches: 8}\ntrain: {batch_size: 16}\n", "a.yaml");
  validate(c);
  const pp::ScheduleShape shape = pipeline_shape(c);
  EXPECT_EQ(shape.kind, parallel::PipelineSchedule::INTERLEAVED_1F1B);
  EXPECT_EQ(shape.ranks, 4);
  EXPECT_EQ(shape.stages_per_rank, 2);
  EXPECT_EQ(shape.microbatches, 8);
  EXPECT_EQ(pipeline_shape(parse_config("parallel: {pp_size: 2}\n", "a.yaml")).microbatches, 2);
  expect_error<ConfigError>([] { validate(parse_config("parallel: {pp_size: 2, pp_microbatches: 3}\n", "a.yaml")); },
                            {"train.batch_size 8 does not split into 3 pipeline microbatches", "(1, 2, 4, 8)"});
  expect_error<ConfigError>([] { validate(parse_config("parallel: {pp_size: 4, pp_microbatches: 2}\n", "a.yaml")); },
                            {"parallel.pp_*", "at least 4 microbatches, or gpipe"});
  expect_error<ConfigError>(
      [] { validate(parse_config("parallel: {pp_size: 2, pp_schedule: interleaved_1f1b, pp_microbatches: 2}\n",
                                 "a.yaml")); },
      {"2 or more stages per rank"});
  expect_error<ConfigError>([] { parse_config("parallel: {pp_schedule: zb}\n", "a.yaml"); },
                            {"gpipe, 1f1b, interleaved_1f1b, zero_bubble"});
  expect_error<ConfigError>([] { validate(parse_config("parallel: {pp_size: 0}\n", "a.yaml")); },
                            {"parallel.pp_size", "1 (no pipeline) or more"});
}

// parallel.layout: auto, also as `parallel: auto` and `--parallel=auto`; the keys it chooses, given beside it, are
// refused by name.
TEST(Config, AutoLayoutIsTheLayoutsShorthand) {
  EXPECT_EQ(parse_config("parallel: auto\n", "a.yaml").parallel.layout, Layout::AUTO);
  EXPECT_EQ(parse_config("parallel: {layout: auto, mixed_precision: bf16}\n", "a.yaml").parallel.layout,
            Layout::AUTO);
  EXPECT_EQ(parse_config("", "a.yaml", {"--parallel=auto"}).parallel.layout, Layout::AUTO);
  EXPECT_EQ(parse_config("", "a.yaml").parallel.layout, Layout::GIVEN);
  const Config c = parse_config("parallel: auto\ntrain: {batch_size: auto}\n", "a.yaml");
  validate(c);
  EXPECT_EQ(parse_config(to_yaml(c), "again.yaml").parallel.layout, Layout::AUTO);
  expect_error<ConfigError>([] { parse_config("parallel: manual\n", "a.yaml"); }, {"parallel.layout", "given, auto"});
  expect_error<ConfigError>(
      [] { validate(parse_config("parallel: {layout: auto, tp_size: 2, strategy: ddp}\n", "a.yaml")); },
      {"parallel.layout: auto chooses parallel.strategy, parallel.tp_size, which the config sets too",
       "parallel.layout: given"});
}

TEST(Config, AccelerateConfigCarriesOver) {
  const Config c = parse_config(R"(
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_POST
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: true
  fsdp_offload_params: false
  fsdp_sharding_strategy: HYBRID_SHARD
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: FlavaLayer,BertLayer
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 2
num_processes: 16
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
)",
                                "accelerate.yaml");
  EXPECT_EQ(c.parallel.strategy, parallel::Strategy::HYBRID_SHARD);
  EXPECT_EQ(c.parallel.wrap, parallel::Wrap::TRANSFORMER);
  EXPECT_EQ(c.parallel.backward_prefetch, Prefetch::BACKWARD_POST);
  EXPECT_EQ(c.parallel.forward_prefetch, 1);
  EXPECT_EQ(c.parallel.layer_classes, (std::vector<std::string>{"FlavaLayer", "BertLayer"}));
  EXPECT_EQ(c.parallel.mixed_precision, parallel::Precision::BF16);
  EXPECT_EQ(c.checkpoint.state_dict_type, StateDictType::FULL);
  EXPECT_EQ(c.launch.num_processes, 16);
  EXPECT_EQ(c.launch.num_machines, 2);

  EXPECT_EQ(parse_config("fsdp_config:\n  fsdp_sharding_strategy: 2\n", "a.yaml").parallel.strategy,
            parallel::Strategy::SHARD_GRAD_OP);
  EXPECT_EQ(parse_config("fsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1e6\n",
                         "a.yaml")
                .parallel.min_params,
            1000000);
  EXPECT_EQ(parse_config("distributed_type: MULTI_CPU\n", "a.yaml").parallel.strategy, parallel::Strategy::DDP);
  // DeepSpeed's: ZeRO stage 3 with the optimizer on NVMe and the parameters on the CPU, as `accelerate config`
  // writes it: full sharding, the disk tier at the optimizer's path.
  const Config zero = parse_config(R"(
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_multinode_launcher: standard
  gradient_accumulation_steps: 2
  gradient_clipping: 0.5
  offload_optimizer_device: nvme
  offload_optimizer_nvme_path: /local_nvme
  offload_param_device: cpu
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
num_processes: 8
)",
                                   "accelerate.yaml");
  EXPECT_EQ(zero.parallel.strategy, parallel::Strategy::FULL_SHARD);
  EXPECT_EQ(zero.parallel.offload, parallel::Offload::NVME);
  EXPECT_EQ(zero.parallel.nvme_path, "/local_nvme");
  EXPECT_EQ(zero.train.grad_accum, 2);
  EXPECT_DOUBLE_EQ(zero.train.max_grad_norm, 0.5);
  EXPECT_EQ(parse_config("deepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: cpu\n", "a.yaml").parallel.offload,
            parallel::Offload::CPU);
  EXPECT_EQ(parse_config("deepspeed_config:\n  zero_stage: 2\n", "a.yaml").parallel.strategy,
            parallel::Strategy::SHARD_GRAD_OP);
  expect_error<ConfigError>([] { parse_config("deepspeed_config:\n  zero_stage: 4\n", "a.yaml"); }, {"zero_stage", "'4'"});
  expect_error<ConfigError>([] { parse_config("deepspeed_config:\n  offload_param_device: disk\n", "a.yaml"); },
                            {"offload_param_device", "none, cpu or nvme"});
  // parallel.cpu_offload, FSDP's name for offload: cpu.
  EXPECT_EQ(parse_config("parallel:\n  cpu_offload: true\n", "a.yaml").parallel.offload, parallel::Offload::CPU);
  EXPECT_EQ(parse_config("parallel:\n  offload: nvme\n  nvme_path: /d\n", "a.yaml").parallel.offload,
            parallel::Offload::NVME);
  // The device: auto unless the file names one (Accelerate: MULTI_GPU the GPUs, MULTI_CPU or use_cpu the CPU).
  EXPECT_EQ(c.train.device, parallel::Device::AUTO);  // FSDP, use_cpu: false
  EXPECT_EQ(parse_config("", "a.yaml").train.device, parallel::Device::AUTO);
  EXPECT_EQ(parse_config("distributed_type: MULTI_GPU\n", "a.yaml").train.device, parallel::Device::CUDA);
  EXPECT_EQ(parse_config("distributed_type: MULTI_CPU\n", "a.yaml").train.device, parallel::Device::CPU);
  EXPECT_EQ(parse_config("distributed_type: MULTI_GPU\nuse_cpu: true\n", "a.yaml").train.device,
            parallel::Device::CPU);
  EXPECT_EQ(parse_config("use_cpu: true\ndistributed_type: MULTI_GPU\n", "a.yaml").train.device,
            parallel::Device::CPU);
  EXPECT_EQ(c.launch.gpu_ids, "all");
  EXPECT_EQ(parse_config("gpu_ids: 0,1\n", "a.yaml").launch.gpu_ids, "0,1");
  const Config accumulating = parse_config(
      "gradient_accumulation_steps: 4\ndynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: default\n", "a.yaml");
  EXPECT_EQ(accumulating.train.grad_accum, 4);
  ASSERT_EQ(accumulating.unused_keys.size(), 1u);  // dynamo_config, said at start with the reason
  EXPECT_NE(accumulating.unused_keys[0].find("a.yaml:2: dynamo_config: no effect here (torch.compile"),
            std::string::npos) << accumulating.unused_keys[0];
  expect_error<ConfigError>([] { validate(parse_config("gpu_ids: first\n", "a.yaml")); },
                            {"launch.gpu_ids", "'first'", "all, or GPU indices"});
  EXPECT_EQ(parse_config("fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n", "a.yaml")
                .parallel.strategy,
            parallel::Strategy::SHARD_GRAD_OP);
  expect_error<ConfigError>([] { parse_config("distributed_type: XLA\n", "a.yaml"); },
                            {"a.yaml:1", "distributed_type", "'XLA'"});
  expect_error<ConfigError>([] { parse_config("fsdp_config:\n  fsdp_sharding_strategy: 9\n", "a.yaml"); },
                            {"a.yaml:2", "'9'", "FULL_SHARD"});
  expect_error<ConfigError>([] { parse_config("mixed_precision: fp8\n", "a.yaml"); }, {"'fp8'", "no, bf16, fp16"});
  // ParallelismConfig: the mesh's sizes; context parallelism refused by its key.
  const Config mesh = parse_config("parallelism_config:\n  parallelism_config_dp_replicate_size: 1\n"
                                   "  parallelism_config_dp_shard_size: 2\n  parallelism_config_tp_size: 4\n"
                                   "  parallelism_config_cp_size: 1\n", "a.yaml");
  EXPECT_EQ(mesh.parallel.tp_size, 4);
  EXPECT_EQ(mesh.parallel.dp_shard_size, 2);
  EXPECT_EQ(mesh.parallel.dp_replicate_size, 1);
  expect_error<ConfigError>(
      [] { parse_config("parallelism_config:\n  parallelism_config_cp_size: 2\n", "a.yaml"); },
      {"parallelism_config.parallelism_config_cp_size", "'2'", "context parallelism is not supported"});
}

// Tensor parallelism's keys: what does not combine with it is refused naming both keys.
TEST(Config, TensorParallelKeysAndWhatTheyExclude) {
  EXPECT_EQ(parse_config("parallel: {tp_size: 2, sequence_parallel: true}\n", "a.yaml").parallel.tp_size, 2);
  expect_error<ConfigError>([] { validate(parse_config("", "x.yaml", {"--parallel.sequence_parallel=true"})); },
                            {"parallel.sequence_parallel", "not possible with parallel.tp_size 1"});
  expect_error<ConfigError>([] { validate(parse_config("", "x.yaml", {"--parallel.tp_size=0"})); },
                            {"parallel.tp_size", "0", "1 (no tensor parallelism) or more"});
  validate(parse_config("", "x.yaml", {"--parallel.tp_size=2", "--checkpoint.dir=/tmp/x"}));
  validate(parse_config("", "x.yaml", {"--parallel.tp_size=2", "--checkpoint.dir=/tmp/x", "--parallel.strategy=ddp"}));
  validate(parse_config("", "x.yaml", {"--parallel.tp_size=2", "--checkpoint.state_dict_type=full"}));
  validate(parse_config("", "x.yaml", {"--parallel.tp_size=2", "--optim.name=adafactor"}));
  validate(parse_config("", "x.yaml", {"--parallel.tp_size=2", "--model.lora.r=8"}));
  expect_error<ConfigError>([] { validate(parse_config("", "x.yaml", {"--parallel.dp_replicate_size=2"})); },
                            {"parallel.dp_replicate_size", "2", "not possible under full_shard"});
}

}  // namespace
}  // namespace shardtrain::config
