// The planner (plan/planner.h) on zoo flavors built on the meta device: its batches are the memory model's, its
// configurations fit and come fastest first, and its YAML is a config `shardtrain train` reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <torch/nn/module.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/io/files.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/plan/memory_model.h"
#include "shardtrain/plan/planner.h"
#include "shardtrain/plan/published_runs.h"
#include "support/expect_error.h"
#include "train/auto_layout.h"

namespace shardtrain::plan {
namespace {

using memory::memory_size_text;
using memory::parse_memory_size;

Cluster small_cluster() {
  Cluster c;
  c.gpus = 4;
  c.gpu_memory = parse_memory_size("3GiB");
  c.seq_len = 128;
  return c;
}

TEST(Planner, LargestBatchIsTheLastThatFits) {
  const auto recipe = models::recipe_of("t5-small");
  const ModelShape shape = model_shape(*recipe);
  const Cluster cluster = small_cluster();
  TrainingJob job;
  job.world = 4, job.seq_len = 128, job.device = parallel::Device::CUDA;
  const int64_t batch = largest_batch(*recipe, shape, job, cluster);
  ASSERT_GT(batch, 1);
  const double budget = static_cast<double>(cluster.gpu_memory) * (1 - cluster.memory_margin);
  job.batch = batch;
  EXPECT_LE(estimate_training_memory(*recipe, shape, job).peak_bytes, budget);
  job.batch = batch + 1;
  EXPECT_GT(estimate_training_memory(*recipe, shape, job).peak_bytes, budget);
}

// An estimate says how long its samples are: the model's maximum unless the job gives a length (Llama 3.1's
// 131072 tokens would otherwise be estimated silently).
TEST(Planner, EstimateSaysItsTokens) {
  const auto recipe = models::recipe_of("llama-debug");
  TrainingJob job;
  job.world = 2;
  const MemoryEstimate longest = estimate_training_memory(*recipe, job);
  EXPECT_EQ(longest.tokens, recipe->task()->data_needs().max_text_length);
  const std::string text = format_estimate("llama-debug", job, longest);
  EXPECT_NE(text.find("x " + std::to_string(longest.tokens) + " tokens (the model's maximum)"), std::string::npos)
      << text;
  job.seq_len = 64;
  const MemoryEstimate given = estimate_training_memory(*recipe, job);
  EXPECT_EQ(given.tokens, 64);
  EXPECT_LT(given.peak_bytes, longest.peak_bytes);
  EXPECT_NE(format_estimate("llama-debug", job, given).find("batch 1 per rank x 64 tokens, "), std::string::npos);
  EXPECT_NE(estimate_json("llama-debug", job, given).find("\"tokens\": 64"), std::string::npos);
}

// What the FLAVA and T5 posts report qualitatively: checkpointing, sharding over more GPUs and transformer
// wrapping each buy batch; offload buys more.
TEST(Planner, EachMemoryOptimizationBuysBatch) {
  const auto recipe = models::recipe_of("t5-base");
  const ModelShape shape = model_shape(*recipe);
  const Cluster cluster = small_cluster();
  TrainingJob base;
  base.world = 4, base.seq_len = 128, base.device = parallel::Device::CUDA, base.mixed_precision = parallel::Precision::BF16;
  auto batch = [&](auto change) {
    TrainingJob j = base;
    change(j);
    return largest_batch(*recipe, shape, j, cluster);
  };
  const int64_t fsdp = batch([](TrainingJob&) {});
  EXPECT_GT(batch([](TrainingJob& j) { j.activation_checkpointing = true; }), 2 * fsdp);
  EXPECT_GE(batch([](TrainingJob& j) { j.cpu_offload = true; }), fsdp);
  EXPECT_LT(batch([](TrainingJob& j) { j.strategy = parallel::Strategy::DDP; }), fsdp);
  EXPECT_LT(batch([](TrainingJob& j) { j.wrap = parallel::Wrap::NONE; }), fsdp);
  EXPECT_LT(batch([](TrainingJob& j) { j.world = 2; }), fsdp);
  EXPECT_GT(batch([](TrainingJob& j) { j.mixed_precision = parallel::Precision::NO; }), 0);
}

TEST(Planner, ConfigurationsFitAndComeFastestFirst) {
  const auto recipe = models::recipe_of("bert-large-uncased");
  // BertModel has no MLM head to train: the planner says so rather than planning nothing.
  testing::expect_error<std::invalid_argument>([&] { plan_configurations(*recipe, small_cluster()); },
                                               {"bert-large-uncased", "masked-LM head"});
  const auto llama = models::recipe_of("llama-debug");
  const Cluster cluster = small_cluster();
  const auto configs = plan_configurations(*llama, cluster);
  ASSERT_FALSE(configs.empty());
  for (size_t i = 0; i < configs.size(); ++i) {
    EXPECT_GE(configs[i].job.batch, 1);
    EXPECT_LE(configs[i].memory.peak_bytes, cluster.gpu_memory);
    if (i > 0) EXPECT_GE(configs[i - 1].items_per_second, configs[i].items_per_second);
  }
}

TEST(Planner, RecommendationIsATrainerConfig) {
  const auto recipe = models::recipe_of("llama-debug");
  const auto configs = plan_configurations(*recipe, small_cluster());
  ASSERT_FALSE(configs.empty());
  const PlannedConfig& best = configs.front();
  const config::Config c = config::parse_config(trainer_yaml("llama-debug", best), "plan.yaml");
  EXPECT_EQ(c.model.flavor, "llama-debug");
  EXPECT_EQ(c.train.batch_size, best.job.batch);
  EXPECT_EQ(c.launch.num_processes, 4);
  EXPECT_EQ(c.parallel.activation_checkpointing, best.job.activation_checkpointing);
  EXPECT_EQ(c.parallel.offload != parallel::Offload::NONE, best.job.cpu_offload);
  EXPECT_EQ(c.train.device, parallel::Device::CUDA);
}

// Tensor parallelism is planned within a node (sizes dividing its GPUs, sequence parallel where the family's plan
// can be), neither with offload nor with the model as one unit; LoRA, which it does not combine with, without it. A
// split configuration computes 1 / tp of the step per GPU and moves each layer's input over the group; its items/s
// counts the data-parallel ranks (of each stage, beside a pipeline); its YAML sets parallel.tp_size and
// sequence_parallel.
TEST(Planner, TensorParallelIsPlannedWithinANode) {
  Cluster cluster;
  cluster.gpus = 8, cluster.nodes = 2, cluster.gpu_memory = parse_memory_size("80GiB"), cluster.seq_len = 4096;
  const auto llama = models::recipe_of("llama-3-8b");
  const auto configs = plan_configurations(*llama, cluster);
  std::set<int64_t> sizes;
  for (const PlannedConfig& c : configs) {
    sizes.insert(c.job.tp);
    if (c.job.tp == 1) continue;
    EXPECT_TRUE(c.job.sequence_parallel);
    EXPECT_FALSE(c.job.cpu_offload);
    EXPECT_EQ(c.job.wrap, parallel::Wrap::TRANSFORMER);
    EXPECT_NEAR(c.items_per_second, 8.0 / c.job.tp / c.job.pipeline.ranks * c.job.batch / c.step_seconds,
                1e-9 * c.items_per_second);
  }
  EXPECT_EQ(sizes, (std::set<int64_t>{1, 2, 4}));  // 4 GPUs a node
  // The same job at tp 2 and 1: half the compute a GPU at a batch, and the group's traffic on top.
  TrainingJob job;
  job.world = 8, job.nodes = 2, job.strategy = parallel::Strategy::FULL_SHARD, job.batch = 2, job.seq_len = 4096;
  job.mixed_precision = parallel::Precision::BF16, job.device = parallel::Device::CUDA;
  const PlannedConfig alone = predict(*llama, model_shape(*llama), job, cluster);
  job.tp = 2, job.sequence_parallel = true;
  const PlannedConfig split = predict(*llama, model_shape(*llama, 2), job, cluster);
  EXPECT_LT(split.compute_seconds, alone.compute_seconds);
  EXPECT_GT(split.comm_seconds, 0);
  const auto tensor_parallel = std::find_if(configs.begin(), configs.end(), [](const PlannedConfig& c) {
    return c.job.tp > 1;
  });
  ASSERT_NE(tensor_parallel, configs.end());
  const config::Config c = config::parse_config(trainer_yaml("llama-3-8b", *tensor_parallel), "plan.yaml");
  EXPECT_EQ(c.parallel.tp_size, tensor_parallel->job.tp);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  // LoRA's adapters split with their projections: a rank at tp 2 holds q's and v's A whole (8 x 4096 each) and
  // half their B (4096 x 8, 1024 x 8), in each of 32 layers.
  models::LoraSpec lora;
  lora.r = 8, lora.lora_alpha = 16;
  const auto adapted = models::with_lora(llama, lora);
  EXPECT_EQ(model_shape(*adapted, 2).trainable(), 32 * (2 * 8 * 4096 + (4096 + 1024) * 8 / 2));
  const auto adapted_plans = plan_configurations(*adapted, cluster);
  EXPECT_TRUE(std::any_of(adapted_plans.begin(), adapted_plans.end(),
                          [](const PlannedConfig& c) { return c.job.tp == 2; }));
}

// Pipelines are planned where the family has stages (Llama's with its own head: not a tied one): 1F1B over 4 x pp
// microbatches, FSDP over each stage's ranks, beside every tensor-parallel size a node holds (the 3-D mesh), no
// offload or one-unit wrap; the batch a whole number of microbatches; each rank computes the busiest stage's share
// and waits in the bubble, so the same job at more microbatches is faster; reducing after every microbatch
// (train.sync_each_batch) holds less than keeping the stages' full gradients and moves more; a stage that fits in
// a node gathers over the node's link; the YAML sets the pipeline's (and a 3-D row's tensor-parallel) keys and
// loads.
TEST(Planner, PipelinesArePlannedWhereTheFamilyHasStages) {
  Cluster cluster;
  cluster.gpus = 8, cluster.nodes = 2, cluster.gpu_memory = parse_memory_size("80GiB"), cluster.seq_len = 4096;
  const auto llama = models::recipe_of("llama-3-8b");
  const auto configs = plan_configurations(*llama, cluster);
  std::set<int> sizes;
  std::set<std::pair<int, int64_t>> layouts;  // (pp, tp) of the pipelines
  for (const PlannedConfig& c : configs) {
    sizes.insert(c.job.pipeline.ranks);
    if (c.job.pipeline.ranks == 1) continue;
    layouts.emplace(c.job.pipeline.ranks, c.job.tp);
    EXPECT_FALSE(c.job.cpu_offload);
    EXPECT_NE(c.job.strategy, parallel::Strategy::DDP);
    EXPECT_EQ(c.job.pipeline.microbatches, 4 * c.job.pipeline.ranks);
    EXPECT_EQ(c.job.batch % c.job.pipeline.microbatches, 0);
    EXPECT_NEAR(c.items_per_second, 8.0 / c.job.pipeline.ranks / c.job.tp * c.job.batch / c.step_seconds,
                1e-9 * c.items_per_second);
  }
  EXPECT_EQ(sizes, (std::set<int>{1, 2, 4, 8}));
  for (const std::pair<int, int64_t> layout :
       std::vector<std::pair<int, int64_t>>{{2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}, {8, 1}}) {
    EXPECT_TRUE(layouts.count(layout)) << "pp " << layout.first << " x tp " << layout.second;
  }
  // The tied-head Llama 3.2 has no stages: no pipeline planned.
  for (const PlannedConfig& c : plan_configurations(*models::recipe_of("llama-3.2-1b"), cluster)) {
    EXPECT_EQ(c.job.pipeline.ranks, 1);
  }
  TrainingJob job;
  job.world = 8, job.nodes = 2, job.strategy = parallel::Strategy::FULL_SHARD, job.batch = 16, job.seq_len = 4096;
  job.mixed_precision = parallel::Precision::BF16, job.device = parallel::Device::CUDA;
  job.pipeline.ranks = 2, job.pipeline.microbatches = 2;
  const PlannedConfig two = predict(*llama, model_shape(*llama), job, cluster);
  job.pipeline.microbatches = 8;  // the bubble 1/3 -> 1/9, each microbatch's tokens a quarter
  const PlannedConfig eight = predict(*llama, model_shape(*llama), job, cluster);
  EXPECT_LT(eight.compute_seconds, two.compute_seconds);
  EXPECT_GT(two.comm_seconds, 0);
  job.sync_each_batch = true;  // a stage's gradients sharded over its 4 ranks in float32, not whole in bf16
  const PlannedConfig each = predict(*llama, model_shape(*llama), job, cluster);
  EXPECT_GT(each.comm_seconds, eight.comm_seconds);
  EXPECT_LT(each.memory.backward_bytes, eight.memory.backward_bytes);
  // LoRA through a pipeline reduces a stage's adapters alone: less traffic than training every weight.
  models::LoraSpec lora;
  lora.r = 8, lora.lora_alpha = 16;
  const auto adapted = models::with_lora(llama, lora);
  job.sync_each_batch = false;
  const PlannedConfig adapters = predict(*adapted, model_shape(*adapted), job, cluster);
  EXPECT_LT(adapters.memory.trainable * 100, adapters.memory.parameters);
  EXPECT_EQ(eight.memory.trainable, eight.memory.parameters);
  EXPECT_LT(adapters.comm_seconds, eight.comm_seconds);
  // pp 2 over 2 nodes: each stage's 4 ranks within a node, gathering over its link; the nodes' link carries the
  // stage boundary's activations alone (small beside the gathers: not twice the one-node job's traffic).
  job.nodes = 1;
  const PlannedConfig one_node = predict(*llama, model_shape(*llama), job, cluster);
  EXPECT_GT(eight.comm_seconds, one_node.comm_seconds);
  EXPECT_LT(eight.comm_seconds, 2 * one_node.comm_seconds);
  const auto three_d = std::find_if(configs.begin(), configs.end(), [](const PlannedConfig& c) {
    return c.job.pipeline.ranks > 1 && c.job.tp > 1;
  });
  ASSERT_NE(three_d, configs.end());
  const config::Config mesh = config::parse_config(trainer_yaml("llama-3-8b", *three_d), "plan.yaml");
  EXPECT_EQ(mesh.parallel.pp_size, three_d->job.pipeline.ranks);
  EXPECT_EQ(mesh.parallel.tp_size, three_d->job.tp);
  config::validate(mesh);
  const auto piped = std::find_if(configs.begin(), configs.end(), [](const PlannedConfig& c) {
    return c.job.pipeline.ranks > 1;
  });
  ASSERT_NE(piped, configs.end());
  const config::Config c = config::parse_config(trainer_yaml("llama-3-8b", *piped), "plan.yaml");
  EXPECT_EQ(c.parallel.pp_size, piped->job.pipeline.ranks);
  EXPECT_EQ(c.parallel.pp_microbatches, piped->job.pipeline.microbatches);
  EXPECT_EQ(c.parallel.pp_schedule, parallel::PipelineSchedule::ONE_F_ONE_B);
  EXPECT_EQ(c.train.sync_each_batch, piped->job.sync_each_batch);
  config::validate(c);
}

// LoRA fine-tuning (plan --lora): the base frozen, so gradients and AdamW state are the adapters' alone — a larger
// batch in the same configuration — and so are the reductions and, offloaded, the gradients' way back to the host
// (less traffic a step); the YAML trains the adapters.
// A model directory with weights is fine-tuned (model.from); a zoo flavor or a config.json alone is model.flavor.
TEST(Planner, LoraPlansTheAdaptersAlone) {
  Cluster cluster;
  cluster.gpus = 4, cluster.gpu_memory = parse_memory_size("8GiB"), cluster.seq_len = 512;
  models::LoraSpec lora;
  lora.r = 8, lora.lora_alpha = 16, lora.target_modules = {"q_proj", "v_proj"};
  const auto base = models::recipe_of("qwen2.5-0.5b");
  const auto full = plan_configurations(*base, cluster);
  const auto adapted = plan_configurations(*models::with_lora(base, lora), cluster);
  ASSERT_FALSE(full.empty());
  ASSERT_FALSE(adapted.empty());
  auto same_kind = [](const TrainingJob& a, const TrainingJob& b) {
    return a.tp == b.tp && a.strategy == b.strategy && a.mixed_precision == b.mixed_precision &&
           a.activation_checkpointing == b.activation_checkpointing && a.checkpoint_every == b.checkpoint_every &&
           a.cpu_offload == b.cpu_offload && a.wrap == b.wrap && a.param_bytes == b.param_bytes;
  };
  int compared = 0;
  for (const PlannedConfig& f : full) {
    for (const PlannedConfig& a : adapted) {
      if (!same_kind(f.job, a.job)) continue;
      ++compared;
      EXPECT_GT(a.job.batch, f.job.batch) << parallel::to_string(f.job.strategy);
      TrainingJob at_full_batch = a.job;
      at_full_batch.batch = f.job.batch;
      const auto adapted_recipe = models::with_lora(base, lora);
      const PlannedConfig a_at_f =
          predict(*adapted_recipe, model_shape(*adapted_recipe, a.job.tp), at_full_batch, cluster);
      EXPECT_LT(a_at_f.comm_seconds, f.comm_seconds) << parallel::to_string(f.job.strategy);
    }
  }
  EXPECT_GT(compared, 4);
  const config::Config c =
      config::parse_config(trainer_yaml("qwen2.5-0.5b", adapted.front(), lora), "plan.yaml");
  EXPECT_EQ(c.model.flavor, "qwen2.5-0.5b");
  EXPECT_EQ(c.model.lora.r, 8);
  EXPECT_EQ(c.model.lora.lora_alpha, 16);
  EXPECT_EQ(c.model.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  const std::string dir = ::testing::TempDir() + "plan_model_dir_" + std::to_string(::getpid());
  io::make_directories(dir);
  io::write_file_atomic(dir + "/config.json", {'{', '}'});
  EXPECT_NE(trainer_yaml(dir, adapted.front()).find("model:\n  flavor: " + dir + "\n"), std::string::npos);
  io::write_file_atomic(dir + "/model.safetensors", {});
  EXPECT_NE(trainer_yaml(dir, adapted.front()).find("model:\n  from: " + dir + "\n"), std::string::npos);
  EXPECT_NE(trainer_yaml("Qwen/Qwen2.5-0.5B", adapted.front()).find("from: Qwen/Qwen2.5-0.5B"), std::string::npos);
  io::remove_tree(dir);
}


// A GPU preset sets the constants; a name the planner does not know is refused naming the presets.
TEST(Planner, GpuPresetsSetTheClustersConstants) {
  const Cluster h100 = with_gpu(Cluster{}, gpu_spec("H100"));
  EXPECT_EQ(h100.gpu, "h100");
  EXPECT_EQ(h100.gpu_memory, parse_memory_size("80GiB"));
  EXPECT_EQ(h100.peak_tflops_bf16, 989);
  EXPECT_GT(h100.intra_node_gbps, Cluster{}.intra_node_gbps);  // NVLink 4 over the default A100's NVLink 3
  EXPECT_EQ(gpu_specs().front().name, Cluster{}.gpu);          // the default is a preset
  testing::expect_error<std::invalid_argument>([] { gpu_spec("v100"); },
                                               {"'v100'", "a100-40gb, a100-80gb, h100, h200, l40s"});
}

// CPU offload's optimizer step runs on the host after backward: a rank's shard of the trainable parameters x 28
// bytes over the host bandwidth, in the step time; a node whose host memory cannot hold its ranks' offloaded state
// gets no offloading configuration.
TEST(Planner, OffloadPaysForTheCpuStepAndNeedsHostMemory) {
  Cluster cluster = with_gpu(Cluster{}, gpu_spec("h100"));
  const auto llama = models::recipe_of("llama-3-8b");
  const ModelShape shape = model_shape(*llama);
  TrainingJob job;
  job.world = 8, job.strategy = parallel::Strategy::FULL_SHARD, job.batch = 2, job.seq_len = 8192;
  job.mixed_precision = parallel::Precision::BF16, job.activation_checkpointing = true;
  job.device = parallel::Device::CUDA;
  const PlannedConfig on_device = predict(*llama, shape, job, cluster);
  job.cpu_offload = true;
  const PlannedConfig offloaded = predict(*llama, shape, job, cluster);
  EXPECT_EQ(on_device.optimizer_seconds, 0);
  EXPECT_NEAR(offloaded.optimizer_seconds,
              static_cast<double>(shape.trainable()) / 8 * 28 / (cluster.host_memory_gbps * 1e9), 1e-9);
  EXPECT_GT(offloaded.step_seconds, on_device.step_seconds + offloaded.optimizer_seconds);
  cluster.gpus = 8, cluster.seq_len = 8192;
  const auto any_offload = [](const std::vector<PlannedConfig>& configs) {
    return std::any_of(configs.begin(), configs.end(), [](const PlannedConfig& c) { return c.job.cpu_offload; });
  };
  EXPECT_TRUE(any_offload(plan_configurations(*llama, cluster)));
  cluster.host_memory = parse_memory_size("64GiB");  // 8 ranks' offloaded 8B: 16 B a parameter, about 120 GiB
  EXPECT_FALSE(any_offload(plan_configurations(*llama, cluster)));
}

// `gpus` H100s in one node, training at `seq_len` tokens.
Cluster h100s(int64_t gpus, int64_t seq_len) {
  Cluster cluster = with_gpu(Cluster{}, gpu_spec("h100"));
  cluster.gpus = gpus, cluster.seq_len = seq_len;
  return cluster;
}

// Activation offload is planned only where nothing fits without it (Llama 3.2 1B at 64k tokens on one GPU of
// 12 GiB; with 16 GiB CPU offload alone fits), and then pays for what the layers keep crossing PCIe twice a
// micro-batch; its YAML says parallel.activation_offload.
TEST(Planner, ActivationOffloadOnlyWhereNothingElseFits) {
  const auto llama = models::recipe_of("llama-3.2-1b");
  Cluster cluster = h100s(1, 65536);
  cluster.gpu_memory = parse_memory_size("16GiB");
  const auto roomier = plan_configurations(*llama, cluster);
  ASSERT_FALSE(roomier.empty());
  for (const PlannedConfig& c : roomier) EXPECT_FALSE(c.job.activation_offload);
  cluster.gpu_memory = parse_memory_size("12GiB");
  const auto small = plan_configurations(*llama, cluster);
  ASSERT_FALSE(small.empty());
  for (const PlannedConfig& c : small) {
    EXPECT_TRUE(c.job.activation_offload);
    EXPECT_GT(c.memory.offloaded_activation_bytes, 0);
    EXPECT_LE(c.memory.peak_bytes, cluster.gpu_memory);
  }
  const PlannedConfig& best = small.front();
  EXPECT_TRUE(config::parse_config(trainer_yaml("llama-3.2-1b", best), "plan.yaml").parallel.activation_offload);
  TrainingJob without = best.job;
  without.activation_offload = false;
  const ModelShape shape = model_shape(*llama);
  const double pcie = 2.0 * static_cast<double>(best.memory.offloaded_activation_bytes) / (cluster.pcie_gbps * 1e9);
  EXPECT_NEAR(best.comm_seconds, predict(*llama, shape, without, cluster).comm_seconds + best.job.grad_accum * pcie,
              1e-9);
}

// The disk tier is planned only where nothing fits otherwise: Llama 3 70B on one node of 8 H100s, whose CPU offload
// needs more host memory than the node's 1 TiB (16 B a parameter). Its state's bytes are on disk, the host holds the
// shards and gradients, and the optimizer step is no shorter than reading and writing the moments at disk_gbps.
TEST(Planner, DiskTierOnlyWhereTheHostCannotHoldTheState) {
  const auto llama = models::recipe_of("llama-3-70b");
  Cluster cluster = h100s(8, 8192);
  const auto configs = plan_configurations(*llama, cluster);
  ASSERT_FALSE(configs.empty());
  for (const PlannedConfig& c : configs) {
    EXPECT_TRUE(c.job.optimizer_on_disk && c.job.cpu_offload);
    EXPECT_LE(c.memory.host_bytes * 8, cluster.host_memory);
    EXPECT_NEAR(static_cast<double>(c.memory.disk_bytes), 70.55e9 * 8 / 8, 0.01e9 * 8);  // AdamW's, a rank's share
    EXPECT_GE(c.optimizer_seconds, 2 * static_cast<double>(c.memory.disk_bytes) / (cluster.disk_gbps * 1e9));
  }
  const config::Config yaml = config::parse_config(trainer_yaml("llama-3-70b", configs.front()), "plan.yaml");
  EXPECT_EQ(yaml.parallel.offload, parallel::Offload::NVME);
  EXPECT_FALSE(yaml.parallel.nvme_path.empty());
  cluster.gpus = 32, cluster.nodes = 4;  // a rank's share a quarter: CPU offload fits, the disk is not planned
  for (const PlannedConfig& c : plan_configurations(*llama, cluster)) EXPECT_FALSE(c.job.optimizer_on_disk);
}

// --global-batch: every configuration trains the same samples a step, as micro-batch x accumulation x data-parallel
// ranks (a pipeline's micro-batch a whole number of its microbatches), the largest micro-batch that divides its share and fits; accumulation computes each micro-batch and
// reduces once.
TEST(Planner, GlobalBatchIsSplitIntoMicroBatchesAndAccumulation) {
  Cluster cluster = with_gpu(Cluster{}, gpu_spec("a100-40gb"));
  cluster.gpus = 8, cluster.seq_len = 4096, cluster.global_batch = 64;
  const auto llama = models::recipe_of("llama-3-8b");
  const auto configs = plan_configurations(*llama, cluster);
  ASSERT_FALSE(configs.empty());
  bool accumulates = false;
  for (const PlannedConfig& c : configs) {
    EXPECT_EQ(c.job.batch * c.job.grad_accum * (c.job.world / c.job.tp / c.job.pipeline.ranks), 64);
    accumulates = accumulates || c.job.grad_accum > 1;
  }
  EXPECT_TRUE(accumulates);  // 40 GiB does not hold 8 samples of 4096 tokens of an 8B model in most layouts
  TrainingJob job = configs.front().job;
  const PlannedConfig once = predict(*llama, model_shape(*llama, job.tp), job, cluster);
  job.grad_accum *= 2;
  const PlannedConfig twice = predict(*llama, model_shape(*llama, job.tp), job, cluster);
  EXPECT_NEAR(twice.compute_seconds, 2 * once.compute_seconds, 1e-9 * once.compute_seconds);
  EXPECT_LT(twice.comm_seconds, 2 * once.comm_seconds);  // the gradients reduced once
  EXPECT_NEAR(twice.items_per_second * twice.step_seconds, 2 * once.items_per_second * once.step_seconds, 1e-6);
  const config::Config yaml = config::parse_config(trainer_yaml("llama-3-8b", configs.front()), "plan.yaml");
  EXPECT_EQ(yaml.train.grad_accum, configs.front().job.grad_accum);
  cluster.global_batch = 7;  // no data-parallel size of 8 GPUs divides it but one rank's: tp 8 alone
  const auto sevens = plan_configurations(*llama, cluster);
  ASSERT_FALSE(sevens.empty());
  for (const PlannedConfig& c : sevens) EXPECT_EQ(c.job.world / c.job.tp / c.job.pipeline.ranks, 1);
}

// The throughput model against a published figure: torchtitan's Llama 3.1 8B on 8 H100s (FSDP, bf16, local batch 2
// of 8192 tokens, selective checkpointing): 5,762 tokens/s a GPU. The goal is 25%; docs/notes/throughput-model.md
// keeps the table.
// Every published run the model is held to (plan/published_runs.h: torchtitan's Llama 2 and 3 on A100 and H100,
// FSDP with and without checkpointing, 405B with tensor parallelism) within a quarter of its tokens/s per GPU, and
// the ratio two of them measure (Llama 2 13B without checkpointing over every other layer checkpointed: 1.13x) in
// order and within 10%. On 8 H100 at torchtitan's global batch the plan recommends what its table runs: FSDP in
// bf16 with checkpointing at 2 sequences a GPU.
TEST(Planner, PredictsPublishedRunsWithinAQuarter) {
  const auto checks = check_published_runs();
  ASSERT_GE(checks.size(), 7u);
  std::map<std::string, double> ours, theirs;
  for (const PublishedCheck& c : checks) {
    EXPECT_LE(std::abs(c.error), 0.25) << c.run.setting << ": ours " << c.ours.tokens_per_second_per_gpu;
    EXPECT_NEAR(c.ours.mfu, c.ours.tflops_per_gpu / c.run.cluster.peak_tflops_bf16, 1e-12);
    ours[c.run.setting] = c.ours.tokens_per_second_per_gpu, theirs[c.run.setting] = c.run.tokens_per_second_per_gpu;
  }
  const std::string none = "Llama 2 13B, FSDP, local batch 2 x 4096, no checkpointing";
  const std::string half = "Llama 2 13B, FSDP, local batch 2 x 4096, selective layer checkpointing";
  ASSERT_TRUE(ours.count(none) && ours.count(half));
  const double published = theirs[none] / theirs[half], predicted = ours[none] / ours[half];
  EXPECT_GT(predicted, 1);
  EXPECT_NEAR(predicted, published, 0.1 * published);

  // The posts' ratios: each on the post's side of 1, or said why not (check_published_findings gives a reason only
  // where it expects the model to disagree).
  const auto findings = check_published_findings();
  EXPECT_GE(findings.size(), 10u);
  int holding = 0;
  for (const PublishedFinding& f : findings) {
    EXPECT_TRUE(f.holds || !f.why.empty()) << f.finding << ": " << f.ours;
    holding += f.holds;
  }
  EXPECT_GE(holding, 7);

  Cluster h100 = with_gpu(Cluster{}, gpu_spec("h100"));
  h100.global_batch = 16;
  const auto llama = models::recipe_of("llama-3-8b");
  const auto plans = plan_configurations(*llama, h100);
  ASSERT_FALSE(plans.empty());
  const TrainingJob& chosen = plans[recommended(plans)].job;
  EXPECT_EQ(chosen.tp, 1);
  EXPECT_EQ(chosen.strategy, parallel::Strategy::FULL_SHARD);
  EXPECT_EQ(chosen.mixed_precision, parallel::Precision::BF16);
  EXPECT_TRUE(chosen.activation_checkpointing);
  EXPECT_EQ(chosen.batch, 2);
  EXPECT_FALSE(chosen.cpu_offload);
}

// Float8 (train.fp8) in the throughput model: the projections' GEMMs at the float8 peak and their casts at the
// memory's bandwidth. Llama 3.1 8B on 8 H100, FSDP at torchtitan's Table 1 setting: with fused casts (5 bytes an
// element, torch.compile's) 1.47x bf16 (the published run, priced, is in PredictsPublishedRunsWithinAQuarter);
// with this runtime's unfused casts (21) 1.15x; on A100, which has no float8 tensor cores, slower.
// The float8 all-gather moves fewer bytes. `plan --fp8` prices every configuration so, in bf16 (no float32 rows),
// gathering in float8 under the strategies that shard, and its YAML says so.
TEST(Planner, Float8PricesItsGemmsAtTheFloat8Peak) {
  const auto llama = models::recipe_of("llama-3.1-8b");
  const ModelShape shape = model_shape(*llama);
  const int64_t projections = std::accumulate(shape.layer_float8.begin(), shape.layer_float8.end(), int64_t{0});
  EXPECT_EQ(projections, int64_t{32} * (4096 * 4096 * 2 + 2 * 1024 * 4096 + 3 * 4096 * 14336)) << "every projection";
  Cluster h100 = with_gpu(Cluster{}, gpu_spec("h100"));
  TrainingJob bf16;
  bf16.world = 8, bf16.strategy = parallel::Strategy::FULL_SHARD, bf16.mixed_precision = parallel::Precision::BF16;
  bf16.device = parallel::Device::CUDA, bf16.batch = 2, bf16.seq_len = 8192;
  bf16.activation_checkpointing = true, bf16.checkpoint_every = 2;
  TrainingJob float8 = bf16;
  float8.float8 = parallel::Float8Recipe::TENSORWISE;
  TrainingJob gathered = float8;
  gathered.float8_all_gather = true;
  auto speed = [&](const TrainingJob& j, const Cluster& c) {
    return predict(*llama, shape, j, c).tokens_per_second_per_gpu;
  };
  Cluster fused = h100;
  fused.float8_cast_bytes = 5;
  const double with_fused = speed(float8, fused) / speed(bf16, fused);
  const double unfused = speed(float8, h100) / speed(bf16, h100);
  EXPECT_GT(with_fused, 1.3);
  EXPECT_LT(with_fused, 1.7);
  EXPECT_GT(unfused, 1.05);
  EXPECT_LT(unfused, with_fused - 0.2);
  const Cluster a100 = with_gpu(Cluster{}, gpu_spec("a100-80gb"));
  EXPECT_LT(speed(float8, a100), speed(bf16, a100));
  EXPECT_LT(predict(*llama, shape, gathered, h100).comm_seconds, predict(*llama, shape, float8, h100).comm_seconds);
  std::printf("float8 over bf16, Llama 3.1 8B on 8 H100: fused casts %.2fx, unfused %.2fx\n", with_fused, unfused);

  Cluster cluster = h100;
  cluster.global_batch = 16, cluster.seq_len = 8192;
  cluster.float8 = parallel::Float8Recipe::TENSORWISE;
  const std::vector<PlannedConfig> plans = plan_configurations(*llama, cluster);
  ASSERT_FALSE(plans.empty());
  for (const PlannedConfig& p : plans) {
    EXPECT_EQ(p.job.float8, parallel::Float8Recipe::TENSORWISE);
    EXPECT_FALSE(p.job.mixed_precision == parallel::Precision::NO && p.job.param_bytes == 4);
    const bool shards = p.job.strategy != parallel::Strategy::DDP && p.job.strategy != parallel::Strategy::NO_SHARD;
    EXPECT_EQ(p.job.float8_all_gather, shards) << parallel::to_string(p.job.strategy);
  }
  const PlannedConfig& chosen = plans[recommended(plans)];
  const std::string yaml = trainer_yaml("llama-3.1-8b", chosen, {});
  EXPECT_NE(yaml.find("  fp8: tensorwise\n"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("  fp8_all_gather: true\n") != std::string::npos, chosen.job.float8_all_gather) << yaml;
  const config::Config read = config::parse_config(yaml, "plan.yaml", {});
  EXPECT_EQ(read.train.fp8, parallel::Float8Recipe::TENSORWISE);
}

// parallel.layout: auto runs the planner's recommendation among its configurations at the config's precision (an
// fp16 config's: bf16's rows): Llama 3 8B on 8 ranks of 80 GiB less 10%, the global batch (1 x 2 accumulated x 8)
// kept, the accumulation its split's; its keys set in the config, which then validates with the layout given; what
// it chose, the runner-up, why and the `shardtrain plan` command ranking the same; a budget nothing fits refused,
// naming it.
TEST(Planner, AutoLayoutIsTheRecommendationAtTheConfigsPrecision) {
  config::Config c;
  c.model.flavor = "llama-3-8b";
  c.parallel.layout = config::Layout::AUTO, c.parallel.mixed_precision = parallel::Precision::FP16;
  c.train.device = parallel::Device::CPU, c.train.batch_size = 1, c.train.grad_accum = 2;
  c.data.max_text_length = 4096;
  TrainingJob job;
  job.world = 8, job.nodes = 1;
  const int64_t budget = parse_memory_size("80GiB");
  const auto llama = models::recipe_of("llama-3-8b");
  const train::ChosenLayout chosen = train::choose_layout(c, *llama, job, budget, "the test's", 0.1);
  Cluster cluster;
  cluster.gpus = 8, cluster.gpu_memory = budget, cluster.memory_margin = 0.1, cluster.seq_len = 4096;
  cluster.global_batch = 16;
  std::vector<PlannedConfig> bf16;
  for (const PlannedConfig& p : plan_configurations(*llama, cluster)) {
    if (p.job.mixed_precision == parallel::Precision::BF16 && p.job.param_bytes == 4) bf16.push_back(p);
  }
  ASSERT_GT(bf16.size(), 1u);
  const TrainingJob& expected = bf16[recommended(bf16)].job;
  const config::Config& got = chosen.config;
  EXPECT_EQ(got.parallel.strategy, expected.strategy);
  EXPECT_EQ(got.parallel.tp_size, expected.tp);
  EXPECT_EQ(got.parallel.pp_size, expected.pipeline.ranks);
  EXPECT_EQ(got.parallel.activation_checkpointing, expected.activation_checkpointing);
  EXPECT_EQ(got.parallel.offload != parallel::Offload::NONE, expected.cpu_offload);
  EXPECT_EQ(got.train.batch_size, expected.batch);
  EXPECT_EQ(got.train.batch_size * got.train.grad_accum * 8 / got.parallel.tp_size / got.parallel.pp_size, 16);
  EXPECT_EQ(got.parallel.mixed_precision, parallel::Precision::FP16);
  EXPECT_EQ(got.parallel.layout, config::Layout::GIVEN);
  config::validate(got);
  for (const char* line : {"parallel: auto -> parallel.strategy: ", "\n  runner-up: parallel.strategy: ", "\n  why: ",
                           "shardtrain plan llama-3-8b --gpus 8 --nodes 1 --gpu-memory 85899345920B --memory-margin "
                           "0.1 --seq-len 4096 --global-batch 16`"}) {
    EXPECT_NE(chosen.text.find(line), std::string::npos) << line << "\n" << chosen.text;
  }
  testing::expect_error<std::invalid_argument>(
      [&] { train::choose_layout(c, *llama, job, parse_memory_size("1GiB"), "the test's", 0.1); },
      {"parallel.layout: auto: no layout of llama-3-8b on 8 ranks fits 1.00 GiB a rank (the test's) less 10%",
       "a global batch of 16"});
}

// The recommendation is the fastest configuration unless a simpler one (no tensor parallelism, no offload) is
// within the model's tolerance of it.
TEST(Planner, RecommendsTheSimplerLayoutWithinTheTolerance) {
  auto config = [](int64_t tp, bool offload, double items, int64_t param_bytes = 4) {
    PlannedConfig c;
    c.job.tp = tp, c.job.cpu_offload = offload, c.items_per_second = items, c.job.param_bytes = param_bytes;
    return c;
  };
  EXPECT_EQ(recommended({config(2, false, 10), config(1, true, 9.9), config(1, false, 9.5)}), 2u);
  EXPECT_EQ(recommended({config(2, false, 10), config(1, false, 8.5)}), 0u);  // 15% slower: the fastest
  EXPECT_EQ(recommended({config(1, false, 10), config(2, false, 11)}), 0u);   // not sorted: the first
  EXPECT_EQ(recommended({config(2, false, 10), config(4, false, 9.9)}), 0u);  // no simpler one
  EXPECT_EQ(recommended({config(1, false, 10, 2), config(1, false, 9.8)}), 1u);  // mixed precision over pure bf16
  EXPECT_EQ(recommended({config(2, false, 10, 2), config(1, false, 9.8, 2), config(1, false, 9.6)}), 2u);
}

// FLAVA calls its text and image encoders twice a step (unmasked, then masked): their layers are gathered once
// per call, in forward (resharded after it) and in backward (resharded between the calls), and the throughput
// model moves them so — over the network and, offloaded, over PCIe. Llama calls every unit once.
TEST(Planner, UnitsCalledTwiceAreGatheredOncePerCall) {
  const auto flava = models::recipe_of("flava-debug");
  int64_t encoder_layers = 0;  // counted by name: text.layers.*, image.layers.*
  for (const auto& p : models::build_model(flava).module->named_parameters()) {
    const std::string& name = p.key();
    if (name.rfind("text.layers.", 0) == 0 || name.rfind("image.layers.", 0) == 0) encoder_layers += p.value().numel();
  }
  ASSERT_GT(encoder_layers, 0);
  TrainingJob job;
  job.world = 4, job.batch = 2, job.seq_len = 32, job.device = parallel::Device::CUDA, job.mixed_precision = parallel::Precision::BF16;
  const ModelShape shape = model_shape(*flava);
  EXPECT_EQ(estimate_training_memory(*flava, shape, job).parameters_called_twice, encoder_layers);
  const Cluster cluster = small_cluster();
  const double P = static_cast<double>(shape.parameters()), P2 = static_cast<double>(encoder_layers);
  const double G = static_cast<double>(shape.trainable());  // reduced: all but the frozen codebook
  EXPECT_LT(G, P);
  const double bandwidth = cluster.intra_node_gbps * 1e9, moved = 3.0 / 4.0;  // of what a rank holds, at W = 4
  // bf16 gathers (2 B) and reductions (2 B): FULL_SHARD gathers twice a call, SHARD_GRAD_OP once a call but the
  // first's forward, which the second reuses.
  EXPECT_NEAR(predict(*flava, shape, job, cluster).comm_seconds, (2 * (P + P2) * 2 + G * 2) * moved / bandwidth, 1e-12);
  job.strategy = parallel::Strategy::SHARD_GRAD_OP;
  EXPECT_NEAR(predict(*flava, shape, job, cluster).comm_seconds, ((P + P2) * 2 + G * 2) * moved / bandwidth, 1e-12);
  // CPU offload: a rank's float32 shards cross PCIe for every gather, its trainable gradients back.
  job.cpu_offload = true;
  const double pcie = cluster.pcie_gbps * 1e9;
  EXPECT_NEAR(predict(*flava, shape, job, cluster).comm_seconds,
              ((P + P2) * 2 + G * 2) * moved / bandwidth + ((P + P2) + G) / 4 * 4 / pcie, 1e-12);
  job.strategy = parallel::Strategy::FULL_SHARD;
  EXPECT_NEAR(predict(*flava, shape, job, cluster).comm_seconds,
              (2 * (P + P2) * 2 + G * 2) * moved / bandwidth + (2 * (P + P2) + G) / 4 * 4 / pcie, 1e-12);
  const auto llama = models::recipe_of("llama-debug");
  EXPECT_EQ(estimate_training_memory(*llama, model_shape(*llama), job).parameters_called_twice, 0);
}

// Without --seq-len a plan trains at the model's length up to 8192 tokens: Llama 3.1's 131072 is its reach at
// inference, not what it trains at.
TEST(Planner, DefaultTokensAreATrainingLength) {
  EXPECT_EQ(default_tokens(*models::recipe_of("llama-3.1-8b")), kDefaultTokens);
  const auto gpt2 = models::recipe_of("gpt2");
  EXPECT_EQ(default_tokens(*gpt2), 1024);  // n_positions
  EXPECT_LT(default_tokens(*gpt2), kDefaultTokens);
}

TEST(Planner, MemorySizesParseAndBadOnesAreNamed) {
  for (const char* text : {"40GiB", "80GB", "1536MiB", "512KiB", "12345B", "1TiB"}) {
    EXPECT_EQ(memory_size_text(parse_memory_size(text)), text);  // the exact text reads back to the bytes
  }
  EXPECT_EQ(memory_size_text(parse_memory_size("1.5GiB")), "1536MiB");
  EXPECT_EQ(memory_size_text(0), "");
  EXPECT_EQ(parse_memory_size("40GiB"), 40LL << 30);
  EXPECT_EQ(parse_memory_size("80GB"), 80'000'000'000LL);
  EXPECT_EQ(parse_memory_size("1.5 TiB"), 3LL << 39);
  EXPECT_EQ(parse_memory_size("512mib"), 512LL << 20);
  EXPECT_EQ(parse_memory_size("4096B"), 4096);
  testing::expect_error<std::invalid_argument>([] { parse_memory_size("80"); },
                                               {"'80' has no unit", "80GiB", "80GB", "80B"});
  for (const char* bad : {"40XB", "GiB", "-3GiB", ""}) {
    testing::expect_error<std::invalid_argument>([&] { parse_memory_size(bad); }, {"'" + std::string(bad) + "'"});
  }
  Cluster odd = small_cluster();
  odd.nodes = 3;
  testing::expect_error<std::invalid_argument>([&] { plan_configurations(*models::recipe_of("t5-debug"), odd); },
                                               {"4 GPUs", "3 nodes"});
  TrainingJob job;
  job.world = 3, job.nodes = 2;
  testing::expect_error<std::invalid_argument>(
      [&] { estimate_training_memory(*models::recipe_of("t5-debug"), job); }, {"3 ranks", "2 nodes"});
}

}  // namespace
}  // namespace shardtrain::plan
