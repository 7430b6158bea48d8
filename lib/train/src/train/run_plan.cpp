// train::plan_run: a run's config as the memory model's job, its estimate, train.batch_size: auto and
// parallel.layout: auto (train/auto_layout.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/memory/memory_size.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/planner.h"
#include "shardtrain/train/trainer.h"
#include "train/auto_layout.h"
#include "train/training_data.h"

namespace shardtrain::train {

using memory::readable_size;

namespace {

constexpr double kAutoMargin = 0.10;  // of the budget kept free by batch_size auto: the model's error, allocator slack

// The world is the launcher's when there is one (`shardtrain launch`, torchrun, Slurm), else the config's launch.*.
plan::TrainingJob job_of(const config::Config& c) {
  plan::TrainingJob job;
  job.world = c.launch.num_processes, job.nodes = c.launch.num_machines;
  const dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
  if (env.source != dist::EnvSource::NONE) {
    job.world = env.world_size;
    job.nodes = std::max(1, env.world_size / std::max(1, env.local_world_size));
  }
  job.strategy = c.parallel.strategy;
  job.wrap = c.parallel.wrap;
  job.mixed_precision = c.parallel.mixed_precision;
  job.activation_checkpointing = c.parallel.activation_checkpointing;
  job.checkpoint_every = c.parallel.activation_checkpointing_every;
  job.forward_prefetch = c.parallel.forward_prefetch;
  job.grad_accum = c.train.grad_accum, job.sync_each_batch = c.train.sync_each_batch;
  job.cpu_offload = c.parallel.offload != parallel::Offload::NONE;
  job.optimizer_on_disk = c.parallel.offload == parallel::Offload::NVME;
  job.activation_offload = c.parallel.activation_offload;
  job.async_checkpoint = c.checkpoint.async && !c.checkpoint.dir.empty();
  job.bucket_cap_mb = c.parallel.bucket_cap_mb, job.gradient_as_bucket_view = c.parallel.gradient_as_bucket_view;
  job.tp = c.parallel.tp_size, job.sequence_parallel = c.parallel.sequence_parallel;
  job.float8 = c.train.fp8;
  job.float8_all_gather = c.train.fp8_all_gather;
  if (c.parallel.pp_size > 1) {
    job.pipeline = config::pipeline_shape(c), job.pipeline_split_points = c.parallel.pp_split_points;
  }
  job.batch = c.train.batch_size;
  job.seq_len = c.data.max_text_length;
  job.device = c.train.device;
  auto bytes = [](config::Dtype d) -> int64_t { return d == config::Dtype::FLOAT32 ? 4 : 2; };
  job.param_bytes = bytes(c.model.dtype);
  if (c.optim.name == config::OptimizerKind::SGD) {
    job.optimizer = "SGD";  // the momentum buffer, in the parameters' dtype
    job.optimizer_state_bytes = c.optim.momentum > 0 ? job.param_bytes : 0;
  } else if (c.optim.name == config::OptimizerKind::ADAFACTOR) {
    // Factored second moments: rows + columns per matrix, next to nothing per parameter; a first moment with beta1.
    job.optimizer = "Adafactor";
    job.optimizer_state_bytes = c.optim.beta1 > 0 ? 4 : 0;
  } else if (c.optim.name == config::OptimizerKind::ANYPRECISION_ADAMW) {
    job.optimizer = "AnyPrecision AdamW";
    job.optimizer_state_bytes = bytes(c.optim.momentum_dtype) + bytes(c.optim.variance_dtype) +
                                (c.optim.use_kahan_summation ? bytes(c.optim.compensation_buffer_dtype) : 0);
  } else {
    job.fused_optimizer = c.optim.fused;
  }
  job.mlm_probability = c.data.mlm_probability, job.mim_probability = c.data.mim_probability;
  job.itm_negative_probability = c.data.itm_negative_probability;
  return job;
}

// The bytes one rank of `job` cannot go beyond, for an explicit batch: train.memory_limit, else train.memory_budget,
// else the GPU's memory, else this machine's RAM shared by the ranks on it; 0 when unknown (no GPU to ask).
int64_t hard_budget_of(const config::Config& c, const plan::TrainingJob& job, std::string& source) {
  if (c.train.memory_limit > 0) {
    source = "train.memory_limit";
    return c.train.memory_limit;
  }
  if (c.train.memory_budget > 0) {
    source = "train.memory_budget";
    return c.train.memory_budget;
  }
  if (c.train.device == parallel::Device::CUDA) {
    source = "the GPU's memory";
    try {
      return memory::cuda_total_memory(0);
    } catch (const std::exception&) {
      return 0;  // the run itself says there is no GPU
    }
  }
  const int64_t ram = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t ranks_here = std::max<int64_t>(1, job.world / job.nodes);
  source = "this machine's RAM shared by " + std::to_string(ranks_here) + " rank" + (ranks_here == 1 ? "" : "s");
  return ram / ranks_here;
}

// Bytes one rank may use: train.memory_budget, else train.memory_limit, else the GPU's memory, else half of this
// machine's RAM shared by the ranks on it.
int64_t budget_of(const config::Config& c, const plan::TrainingJob& job, std::string& source) {
  if (c.train.memory_budget > 0) {
    source = "train.memory_budget";
    return c.train.memory_budget;
  }
  if (c.train.memory_limit > 0) {
    source = "train.memory_limit";
    return c.train.memory_limit;
  }
  if (c.train.device == parallel::Device::CUDA) {
    source = "the GPU's memory";
    return memory::cuda_total_memory(0);
  }
  const int64_t ram = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t ranks_here = std::max<int64_t>(1, job.world / job.nodes);
  source = "half of this machine's RAM shared by " + std::to_string(ranks_here) + " ranks";
  return ram / 2 / ranks_here;
}

// What this machine's kernel says it can give without swapping (MemAvailable in /proc/meminfo), in bytes; 0 when it
// does not say.
int64_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

// The single changes of `job` that bring its predicted peak within `budget` at the same batch, as config keys:
// "; at this batch parallel.activation_checkpointing: true fits (2.1 MiB)"; "" when none does.
std::string fitting_changes(const models::ModelRecipe& recipe, const plan::ModelShape& shape,
                            const plan::TrainingJob& job, int64_t budget) {
  std::vector<std::pair<std::string, plan::TrainingJob>> changes;
  if (!job.activation_checkpointing) {
    plan::TrainingJob checkpointed = job;
    checkpointed.activation_checkpointing = true, checkpointed.checkpoint_every = 1;
    changes.emplace_back("parallel.activation_checkpointing: true", checkpointed);
  }
  if (job.world / job.tp > 1 && job.strategy != parallel::Strategy::FULL_SHARD &&
      !parallel::is_hybrid(job.strategy)) {
    plan::TrainingJob sharded = job;
    sharded.strategy = parallel::Strategy::FULL_SHARD;
    changes.emplace_back("parallel.strategy: full_shard", sharded);
  }
  if (job.tp > 1 && !job.sequence_parallel && models::splits_sequence(recipe.tp_plan())) {
    plan::TrainingJob sequence = job;
    sequence.sequence_parallel = true;
    changes.emplace_back("parallel.sequence_parallel: true", sequence);
  }
  std::string out;
  for (const auto& [key, changed] : changes) {
    const int64_t peak = plan::estimate_training_memory(recipe, shape, changed).peak_bytes;
    if (peak > budget) continue;
    out += std::string(out.empty() ? "; at this batch " : ", or ") + key + " fits (" + readable_size(peak) +
           ")";
  }
  return out;
}

}  // namespace

RunPlan plan_run(const config::Config& given, int64_t auto_batch_limit) {
  config::Config config = given;  // train.device: auto as what this machine gives it
  config.train.device = cuda::resolve_device(given.train.device);
  const RunLabels labels = run_labels(config);
  const auto recipe = models::with_lora(
      models::recipe_for_task(models::recipe_of_model(config.model.flavor, config.model.overrides), config.model.task,
                              {labels.names, labels.multi_label, std::nullopt, std::nullopt}),
      config.model.lora);
  plan::TrainingJob job = job_of(config);
  std::string layout_text;
  if (config.parallel.layout == config::Layout::AUTO) {
    std::string source;
    const int64_t budget = budget_of(config, job, source);
    ChosenLayout chosen = choose_layout(config, *recipe, job, budget, source, kAutoMargin);
    config = std::move(chosen.config), layout_text = std::move(chosen.text);
    job = job_of(config);
  }
  RunPlan out;
  out.config = config, out.text = layout_text, out.layout_text = layout_text;
  const plan::ModelShape shape = plan::model_shape(*recipe, job.tp);
  if (config.train.batch_size == config::kAutoBatch) {
    std::string source;
    const int64_t budget = budget_of(config, job, source);
    out.budget_bytes = budget, out.budget_source = source;
    plan::Cluster cluster;
    cluster.gpu_memory = budget, cluster.memory_margin = kAutoMargin;
    const int64_t fits = plan::largest_batch(*recipe, shape, job, cluster);
    // A pipeline's batch is a whole number of its microbatches (largest_batch's are; a limit is rounded down).
    const int64_t unit = job.batch_unit();
    job.batch = (auto_batch_limit > 0 ? std::min(fits, auto_batch_limit) : fits) / unit * unit;
    if (job.batch < 1 && fits >= unit) {
      throw std::invalid_argument("train.batch_size: auto: at most " + std::to_string(auto_batch_limit) +
                                  " after an out-of-memory, less than one sample for each of the " +
                                  std::to_string(unit) + " pipeline microbatches");
    }
    if (job.batch < 1) {
      job.batch = unit;
      throw std::invalid_argument(
          "train.batch_size: auto: not even one sample " +
          (unit > 1 ? "per pipeline microbatch (" + std::to_string(unit) + " per rank)" : std::string("per rank")) +
          " fits " + readable_size(budget) + " (" + source + "): " + (unit > 1 ? "they need " : "one sample needs ") +
          readable_size(plan::estimate_training_memory(*recipe, shape, job).peak_bytes) +
          "; shard over more ranks, checkpoint activations or offload");
    }
    out.config.train.batch_size = job.batch;
    const std::string fitting = "predicted peak fits " + readable_size(budget) + " (" + source + ") less " +
                                std::to_string(static_cast<int>(kAutoMargin * 100)) + "%";
    out.text += "train.batch_size: auto -> " + std::to_string(job.batch) + " per rank: " +
                (job.batch < fits ? "at most " + std::to_string(auto_batch_limit) +
                                        " after an out-of-memory in the first two steps (the largest whose " +
                                        fitting + " is " + std::to_string(fits) + ")"
                                  : "the largest whose " + fitting) + "\n";
  }
  const plan::MemoryEstimate e = plan::estimate_training_memory(*recipe, shape, job);
  if (config.train.batch_size != config::kAutoBatch) {
    std::string source;
    const int64_t budget = hard_budget_of(config, job, source);
    out.budget_bytes = budget, out.budget_source = source;
    if (budget > 0 && e.peak_bytes > budget) {
      plan::Cluster cluster;
      cluster.gpu_memory = budget, cluster.memory_margin = 0;
      cluster.max_batch = config.train.batch_size;  // it does not fit: the answer is below it
      const int64_t fits = plan::largest_batch(*recipe, shape, job, cluster);
      out.over_budget = "train.batch_size: " + std::to_string(config.train.batch_size) + " per rank is predicted to " +
                        "need " + readable_size(e.peak_bytes) + " per rank (" + e.peak_phase + "), above " +
                        readable_size(budget) + " (" + source + "); " +
                        (fits > 0 ? "the largest batch that fits is " + std::to_string(fits)
                                  : "not even one sample fits: shard over more ranks, checkpoint activations or "
                                    "offload") +
                        fitting_changes(*recipe, shape, job, budget) +
                        " (`shardtrain train CONFIG --dry-run` shows the terms; train.force: true starts anyway)";
    }
  }
  if (e.checkpoint_staging_bytes > 0) {
    // Every rank of this machine holds its staging buffer from the first save on, beside the rest of its host
    // memory.
    const int64_t ranks_here = std::max<int64_t>(1, job.world / job.nodes), available = available_host_memory();
    if (available > 0 && e.host_bytes * ranks_here > available) {
      out.over_budget += std::string(out.over_budget.empty() ? "" : "\n") + "checkpoint.async: each rank's " +
                         "staging buffer needs " + readable_size(e.checkpoint_staging_bytes) + " of host memory" +
                         (e.host_bytes > e.checkpoint_staging_bytes
                              ? " (" + readable_size(e.host_bytes) + " with the rest it holds there)"
                              : std::string()) +
                         ", " +
                         std::to_string(ranks_here) + " rank" + (ranks_here == 1 ? "" : "s") + " on this machine: " +
                         readable_size(e.host_bytes * ranks_here) + ", above the " + readable_size(available) +
                         " it has available (MemAvailable); save synchronously (checkpoint.async: false) or shard "
                         "over more ranks (train.force: true starts anyway)";
    }
  }
  std::string label = config.model.flavor;  // and the adapters, when LoRA trains them
  if (config.model.lora.enabled()) {
    label += " + " + models::lora_label(config.model.lora, models::lora_targets(*recipe, config.model.lora));
  }
  out.estimate_text = plan::format_estimate(label, job, e);
  out.text += out.estimate_text;
  out.json = plan::estimate_json(label, job, e);
  out.peak_bytes = e.peak_bytes, out.peak_phase = e.peak_phase;
  return out;
}

}  // namespace shardtrain::train
