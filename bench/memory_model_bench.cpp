// One cell of bench/memory_model.py: real training steps of a model under a data-parallel configuration (the
// trainer's own ParallelModel and AdamW), each phase's peak counted by our allocator on every rank, against the
// memory model's prediction (plan/memory_model.h). Run under `shardtrain launch`; rank 0 prints one RESULT line
// (JSON) with the largest rank's measured peaks and the predicted ones.
//
//   memory_model_bench --model MODEL --strategy S [--mixed-precision no|bf16|fp16] [--ac] [--batch B] [--seq-len T]
//                      [--nodes M] [--steps N] [--grad-accum K] [--lora R [--lora-targets a,b] [--lora-dropout P]]
//                      [--tp T [--sp]] [--offload] [--activation-offload] [--nvme DIR]
// MODEL is a flavor or a Hugging Face config.json; the batch is synthetic, of the task's largest kind. --lora: rank-R
// adapters on the targets (default the query and value projections; "all-linear"), the rest frozen (models/lora.h).
// --tp: tensor parallelism over T ranks (--sp: sequence parallel), the strategy over the rest. --offload: CPU offload
// (parallel.cpu_offload): what it keeps in host memory is counted apart (memory::CpuTier::HOST), and RESULT's "host"
// gives its measured peak and the model's host bytes. --activation-offload (parallel.activation_offload): what the
// layers keep for backward in the host tier as well. --nvme DIR: the disk tier (parallel.offload: nvme), AdamW's
// state in a scratch file under DIR, the host tier holding its staging buffers.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/synthetic_batch.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/optim/grad_scaler.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/memory_model.h"
#include "train/parallel_model.h"
#include "train/train_step.h"

namespace {

using namespace shardtrain;

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1) {
    out.push_back(text.substr(start, comma - start));
  }
  out.push_back(text.substr(start));
  return out;
}

int run(int argc, char** argv) {
  std::string model, strategy = "full_shard", precision = "no";
  int64_t batch = 4, seq_len = 128, nodes = 1, steps = 3, grad_accum = 1, tp = 1;
  bool ac = false, sp = false, offload = false, activation_offload = false;
  std::string nvme_path;  // --nvme DIR: the disk tier (offload: nvme) there
  models::LoraSpec lora;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--strategy") strategy = next();
    else if (a == "--mixed-precision") precision = next();
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--seq-len") seq_len = std::stoll(next());
    else if (a == "--nodes") nodes = std::stoll(next());
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--grad-accum") grad_accum = std::stoll(next());
    else if (a == "--ac") ac = true;
    else if (a == "--tp") tp = std::stoll(next());
    else if (a == "--sp") sp = true;
    else if (a == "--offload") offload = true;
    else if (a == "--activation-offload") activation_offload = true;
    else if (a == "--nvme") nvme_path = next();
    else if (a == "--lora") lora.r = std::stoll(next()), lora.lora_alpha = 2.0 * static_cast<double>(lora.r);
    else if (a == "--lora-targets") lora.target_modules = split_commas(next());
    else if (a == "--lora-dropout") lora.lora_dropout = std::stod(next());
    else throw std::invalid_argument("unknown option " + a);
  }
  memory::install_cpu_memory_counter();
  const dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
  dist::ProcessGroup pg = dist::ProcessGroup::init(env, {});
  const auto recipe = models::with_lora(models::recipe_of_model(model), lora);

  plan::TrainingJob job;
  job.world = env.world_size, job.nodes = nodes, job.strategy = parallel::strategy_named(strategy);
  job.mixed_precision = parallel::precision_named(precision);
  job.activation_checkpointing = ac, job.batch = batch, job.seq_len = seq_len;
  job.grad_accum = grad_accum, job.tp = tp, job.sequence_parallel = sp;
  job.activation_offload = activation_offload;
  job.cpu_offload = offload || !nvme_path.empty(), job.optimizer_on_disk = !nvme_path.empty();
  job.fused_optimizer = config::OptimConfig{}.fused;  // the trainer's optimizer, made below
  const plan::MemoryEstimate predicted = plan::estimate_training_memory(*recipe, job);

  config::Config c;
  c.model.lora = lora;
  c.parallel.strategy = job.strategy;
  c.parallel.mixed_precision = job.mixed_precision;
  c.parallel.activation_checkpointing = ac;
  c.train.batch_size = batch;
  c.parallel.tp_size = tp, c.parallel.sequence_parallel = sp, c.parallel.offload = !nvme_path.empty() ? parallel::Offload::NVME
                       : offload          ? parallel::Offload::CPU
                                          : parallel::Offload::NONE;
  c.parallel.nvme_path = nvme_path;
  c.parallel.activation_offload = activation_offload;
  const bool hybrid = parallel::is_hybrid(c.parallel.strategy);
  const dist::DeviceMesh mesh =
      dist::DeviceMesh::create(pg, hybrid ? static_cast<int>(nodes) : 1, -1, static_cast<int>(tp));
  const auto task = recipe->task();
  train::ParallelModel parallel(c, recipe, task->leaves_parameters_unused(), mesh, at::Device(at::kCPU));
  auto optimizer = train::make_optimizer(c, parallel);
  const uint64_t seed = 1000 + static_cast<uint64_t>(mesh.data_rank());  // a tensor-parallel group's one batch
  // A task that mixes kinds (FLAVA) trains every head over a run: a step of each kind first, so that AdamW holds
  // the state of every head when the image-text step is measured. Each step's batch is made for it and dropped
  // before the optimizer step, as the trainer's loop drops its micro-batches (train/train_step.cpp).
  const int64_t warmup = task->data_needs().mixes_kinds ? 2 : 0;
  auto batch_of_step = [&](int64_t s) {
    models::DataNeeds needs = task->data_needs();
    if (s < warmup) needs.kinds = {false, s == 0, s == 1};
    return models::synthetic_batch(needs, batch, seq_len, seed);
  };
  // float16 scales the loss and unscales the gradients before the step, as the trainer's loop does.
  std::optional<optim::GradScaler> scaler;
  if (c.parallel.mixed_precision == parallel::Precision::FP16) scaler.emplace(optim::GradScalerOptions{}, pg.world());

  // One training step on `batch_s`, each phase's peak recorded, and the host tier's over them all; false when
  // float16's scaler skipped it.
  int64_t forward = 0, backward = 0, step = 0, host = 0;
  auto host_peak = [] { return memory::cpu_memory_stats(memory::CpuTier::HOST).peak_bytes; };
  auto train_step = [&](data::Batch batch_s) {
    // Micro-batches without a reduction until the last (the trainer's gradient accumulation); the phases' peaks
    // are the largest over them.
    forward = backward = host = 0;
    for (int64_t m = 0; m < grad_accum; ++m) {
      parallel.set_gradient_sync(m + 1 == grad_accum);
      memory::reset_cpu_peak();
      models::Losses losses = task->compute_losses(*parallel.module(), batch_s, 0);
      forward = std::max(forward, memory::cpu_memory_stats().peak_bytes);
      host = std::max(host, host_peak());
      memory::reset_cpu_peak();
      (scaler ? scaler->scale(losses.total) : losses.total).backward();
      losses = {};
      backward = std::max(backward, memory::cpu_memory_stats().peak_bytes);
      host = std::max(host, host_peak());
    }
    batch_s = {};
    memory::reset_cpu_peak();
    parallel.finish_gradients();
    // Offloaded, the step runs where the shards are, as the trainer's (train/train_step.cpp).
    const memory::CpuTierScope tier(job.cpu_offload ? memory::CpuTier::HOST : memory::CpuTier::COMPUTE);
    if (scaler) scaler->unscale(*optimizer);
    parallel.clip_grad_norm(INFINITY, optimizer->param_groups());
    bool stepped = true;
    if (scaler) {
      stepped = scaler->step(*optimizer);
      scaler->update();
    } else {
      optimizer->step();
    }
    optimizer->zero_grad();
    step = memory::cpu_memory_stats().peak_bytes;
    host = std::max(host, host_peak());
    return stepped;
  };
  // Under float16 a step whose scaled gradients overflow is skipped (the scale backs off) and AdamW makes no state
  // for them: each step runs again until it steps, as training soon does, so that every head's state is held
  // (until 2026-11-27 the image-only warm-up step was skipped at the first scale, and FLAVA's fp16 cells measured
  // 9 MB less than their bf16 twins: the MIM head's AdamW state).
  std::string skipped;  // "step 1 twice, ..." (the warm-up steps first)
  for (int64_t s = 0; s < steps + warmup; ++s) {  // the last step is reported
    int attempt = 0;
    while (attempt < 40 && !train_step(batch_of_step(s))) ++attempt;
    if (attempt > 0) skipped += (skipped.empty() ? "" : ", ") + std::to_string(s) + " x" + std::to_string(attempt);
  }
  if (env.rank == 0 && !skipped.empty()) {
    std::cerr << "memory_model_bench: float16 steps skipped and run again (step x times): " << skipped << "\n";
  }
  at::Tensor peaks = at::tensor({forward, backward, step, host}, at::kLong).to(at::kDouble);
  pg.world().all_reduce(peaks, dist::ReduceOp::MAX).wait();
  if (env.rank == 0) {
    nlohmann::json r;
    r["model"] = model, r["strategy"] = strategy, r["world"] = env.world_size, r["precision"] = precision;
    r["tp"] = tp, r["sp"] = sp;
    r["ac"] = ac, r["batch"] = batch, r["seq_len"] = seq_len, r["parameters"] = predicted.parameters;
    r["measured"] = {peaks[0].item<double>(), peaks[1].item<double>(), peaks[2].item<double>()};
    r["predicted"] = {predicted.forward_bytes, predicted.backward_bytes, predicted.step_bytes};
    r["offload"] = offload, r["activation_offload"] = activation_offload;
    r["host"] = {peaks[3].item<double>(), predicted.host_bytes};
    std::cout << "RESULT " << r.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "memory_model_bench: " << e.what() << "\n";
    return 1;
  }
}
