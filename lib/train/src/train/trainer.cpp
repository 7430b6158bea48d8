#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/train/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "shardtrain/data/pipeline/random.h"
#include "shardtrain/ckpt/async_save.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/heartbeat.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/distributed/replica_check.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/launch/error_file.h"
#include "shardtrain/launch/launch.h"
#include "shardtrain/memory/memory_size.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/disk_adamw.h"
#include "shardtrain/plan/memory_model.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/train/schedule.h"
#include "train/checkpoint_lock.h"
#include "train/metrics_log.h"
#include "train/nonfinite_policy.h"
#include "train/pipeline_step.h"
#include "train/preemption.h"
#include "train/run_checkpoint.h"
#include "train/train_step.h"
#include "train/training_data.h"
#include "shardtrain/util/with_commas.h"

namespace shardtrain::train {
namespace {

using config::Config;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g s", seconds);
  return text;
}

log::Level log_level_of(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::DEBUG: return log::Level::DEBUG;
    case config::LogLevel::INFO: return log::Level::INFO;
    case config::LogLevel::WARNING: return log::Level::WARNING;
    case config::LogLevel::ERROR: return log::Level::ERROR;
  }
  return log::Level::INFO;
}

// The environment's launcher variables, once the config is known to be valid (nothing starts on a bad config).
dist::DistEnv checked_env(const Config& c) {
  config::validate(c);
  return dist::read_dist_env(dist::process_env_lookup());
}

// Each rank its local GPU, shared round-robin by more ranks than GPUs (dist::rank_device); their collectives then
// go through Gloo (dist::group_options_for).
at::Device device_of(const Config& c, const dist::DistEnv& env) {
  return dist::rank_device(c.train.device == parallel::Device::CUDA, env, "train.device: 'cuda'");
}

// `sink`: where a rendezvous that waits for its peers says so (every rank: each waits for its own reasons).
dist::ProcessGroupOptions init_options(const Config& c, const at::Device& device, const dist::DistEnv& env,
                                       const std::shared_ptr<log::Sink>& sink = nullptr) {
  dist::ProcessGroupOptions init = dist::group_options_for(device, env);
  init.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.parallel.timeout * 1000.0));
  if (sink) {
    const log::Logger logger(sink, env.rank);
    init.waiting_note = [logger](const std::string& line) { logger.info_every_rank(line); };
  }
  return init;
}

// The model's recipe with the task's head; T5's span corruption takes its sentinels from the tokenizer's
// <extra_id_0> when it has one.
std::shared_ptr<const models::ModelRecipe> checked_recipe(const Config& c, const data::Tokenizer* tokenizer) {
  models::TaskSetup setup{c.data.labels, c.data.multi_label, std::nullopt, std::nullopt};
  if (tokenizer) setup.first_sentinel = tokenizer->find("<extra_id_0>"), setup.pad_token_id = tokenizer->pad_id();
  auto recipe = models::with_lora(
      models::recipe_for_task(models::recipe_of_model(c.model.flavor, c.model.overrides), c.model.task, setup),
      c.model.lora);
  if (!c.model.family.empty() && c.model.family != recipe->family()) {
    throw std::invalid_argument("model.family: '" + c.model.family + "' but " + c.model.flavor + " is a " +
                                recipe->family() + " flavor");
  }
  return recipe;
}

// [Note: ending a rank for a stuck peer] The heartbeat found that a peer stopped: this rank is, or soon will be,
// blocked in a collective that no backend can cancel (Gloo has no abort), so waiting for its timeout only delays
// the verdict. Like PyTorch's NCCL watchdog, the process ends: the reason on stderr and in the launcher's error
// file (the job's root cause), exit code 1; the launcher then stops the others, the stuck rank included.
void end_for_stuck_peer(const std::string& message) {
  const std::string line = "shardtrain train: error: " + message + "\n";
  [[maybe_unused]] const ssize_t n = ::write(2, line.data(), line.size());
  launch::record_error(message);
  std::_Exit(1);
}

// What the whole run shares: the process group of the environment's launcher (a world of one without), where it
// computes, the console, and the model's recipe and task.
struct Job {
  Job(const Config& c, std::shared_ptr<log::Sink> sink)
      : env(checked_env(c)),
        device(device_of(c, env)),
        pg(dist::ProcessGroup::init(env, init_options(c, device, env, sink))),
        logger(std::move(sink), pg.world().rank(), {log_level_of(c.log.level)}),
        tokenizer(open_run_tokenizer(c)),
        recipe(checked_recipe(c, tokenizer.get())),
        task(recipe->task(c.model.task)) {
    if (!device.is_cuda()) memory::install_cpu_memory_counter();
    // The peak memory the run reports is its own: a run started again after an out-of-memory (train()) would
    // otherwise report the failed attempt's.
    device.is_cuda() ? memory::reset_cuda_peak(device.index()) : memory::reset_cpu_peak();
    if (c.train.memory_limit > 0) {  // before the model: everything the run holds counts
      const int64_t limit = c.train.memory_limit;
      device.is_cuda() ? memory::set_cuda_memory_limit(device.index(), limit) : memory::set_cpu_memory_limit(limit);
    }
    if (device.is_cuda()) {  // train.tf32: cuBLAS matmuls and cuDNN convolutions of float32 tensors
      at::globalContext().setAllowTF32CuBLAS(c.train.tf32);
      at::globalContext().setAllowTF32CuDNN(c.train.tf32);
    }
    if (device.is_cuda() && c.train.fp8) {  // _scaled_mm needs float8 tensor cores: compute capability 8.9 and up
      const cuda::DeviceProperties gpu = cuda::device_properties(device.index());
      if (gpu.major * 10 + gpu.minor < 89) {
        throw std::invalid_argument("train.fp8: " + parallel::to_string(*c.train.fp8) + " needs float8 tensor cores "
                                    "(compute capability 8.9 or more: Ada, Hopper, Blackwell); " + gpu.name +
                                    " is " + std::to_string(gpu.major) + "." + std::to_string(gpu.minor) +
                                    " (train without train.fp8 there)");
      }
    }
    if (pg.world_size() > 1) {
      const auto timeout = init_options(c, device, env).timeout;
      heartbeat = std::make_unique<dist::Heartbeat>(pg, dist::heartbeat_options_for(timeout), end_for_stuck_peer);
    }
  }

  // What this rank is doing, for the heartbeat's report of a hang.
  void doing(const std::string& activity) const {
    if (heartbeat) heartbeat->set_activity(activity);
  }

  dist::DistEnv env;
  at::Device device;
  dist::ProcessGroup pg;
  log::Logger logger;
  std::shared_ptr<const data::Tokenizer> tokenizer;  // null when the model reads no text and none is named
  std::shared_ptr<const models::ModelRecipe> recipe;
  std::unique_ptr<models::Task> task;
  std::unique_ptr<dist::Heartbeat> heartbeat;  // W > 1
};

// parallel.pp_size x dp_replicate_size x dp_shard_size x tp_size (config.h), the sizes left 0 inferred: HYBRID
// strategies replicate across the nodes and shard within one, the others shard over every data-parallel rank of a
// pipeline stage. Throws std::invalid_argument naming the sizes when they do not make the world, before any group is
// made.
dist::DeviceMesh make_mesh(const Config& c, Job& job) {
  const int64_t world = job.pg.world_size(), tp = c.parallel.tp_size, pp = c.parallel.pp_size;
  const int64_t nodes = std::max(1, job.env.world_size / std::max(1, job.env.local_world_size));
  const int64_t replicate = c.parallel.dp_replicate_size > 0 ? c.parallel.dp_replicate_size
                            : parallel::is_hybrid(c.parallel.strategy) ? nodes : 1;
  const int64_t shard =
      c.parallel.dp_shard_size > 0 ? c.parallel.dp_shard_size : world / std::max<int64_t>(1, replicate * tp * pp);
  if (pp * replicate * shard * tp != world) {
    auto size = [](int64_t given, int64_t used) {
      return std::to_string(used) + (given == 0 ? " inferred" : "");
    };
    throw std::invalid_argument(
        (pp > 1 ? "parallel.pp_size (" + std::to_string(pp) + ") x " : std::string()) +
        "parallel.dp_replicate_size (" + size(c.parallel.dp_replicate_size, replicate) + ") x parallel.dp_shard_size (" +
        size(c.parallel.dp_shard_size, shard) + ") x parallel.tp_size (" + std::to_string(tp) + ") = " +
        std::to_string(pp * replicate * shard * tp) + ", but the job has " + std::to_string(world) + " processes");
  }
  return dist::DeviceMesh::create(job.pg, static_cast<int>(replicate), static_cast<int>(shard), static_cast<int>(tp),
                                  static_cast<int>(pp));
}

using util::with_commas;

// The FSDP units by kind: "FlavaModel 121,916; 5 x TransformerLayer 24,383" (parameters each, unsharded).
std::string describe_units(const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<std::pair<std::string, int64_t>> kinds;  // (class, parameters), in unit order
  std::map<std::pair<std::string, int64_t>, int> count;
  for (const fsdp::FsdpUnit& unit : fsdp::units_of(root)) {
    const std::pair<std::string, int64_t> kind{unit.module_name(), unit.full_numel()};
    if (count[kind]++ == 0) kinds.push_back(kind);
  }
  std::string out;
  for (const auto& kind : kinds) {
    if (!out.empty()) out += "; ";
    const int n = count[kind];
    out += (n > 1 ? std::to_string(n) + " x " : "") + kind.first + " " + with_commas(kind.second) +
           (n > 1 ? " each" : "");
  }
  return out;
}

// What loading model.init_weights into the model's dtype converted: "model.safetensors (F32 -> BF16: 199 tensors)";
// for a distributed checkpoint, also which of its entries were the weights.
std::string describe_conversion(const Config& c, at::ScalarType model_dtype) {
  std::map<at::ScalarType, int64_t> converted;
  const io::WeightFiles files(c.model.init_weights);
  for (const io::WeightEntry& e : files.entries()) {
    if (e.dtype != model_dtype) ++converted[e.dtype];
  }
  std::string out = c.model.init_weights;
  if (converted.empty()) out += " (" + io::safetensors_dtype_name(model_dtype) + ", as the model: nothing converted)";
  for (const auto& [dtype, count] : converted) {
    out += " (" + io::safetensors_dtype_name(dtype) + " -> " + io::safetensors_dtype_name(model_dtype) + ": " +
           std::to_string(count) + " tensors converted)";
  }
  return files.note().empty() ? out : out + " — " + files.note();
}

// "a, b, c" (the first 6 names, then how many more).
std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 6; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 6) out += " and " + std::to_string(names.size() - 6) + " more";
  return out;
}

// What will happen, before the first step: the model, how it is split and computed, the batch, the data, and the
// memory each rank will need by term (what `--dry-run` prints).
void describe_start(const Config& c, const Job& job, ParallelModel& model, const dist::DeviceMesh& mesh,
                    double peak_tflops, const TrainingData& data, const RunPlan& plan, const PipelineStep* pipeline) {
  const dist::Communicator& world = job.pg.world();
  int64_t parameters = 0;  // the whole model's: sharded, the units' full sizes (a rank holds only its shards)
  if (model.tensor_parallel()) {
    parameters = model.tensor_parallel()->whole_parameters();
  } else if (model.sharded()) {
    for (const fsdp::FsdpUnit& unit : fsdp::units_of(model.module())) parameters += unit.full_numel();
  } else {
    for (const auto& p : model.module()->parameters()) parameters += p.numel();
  }
  if (mesh.pp_size() > 1) {  // each stage counted its own: the sum over the pipeline is the model's
    at::Tensor total = at::full({1}, static_cast<double>(parameters), at::dtype(at::kDouble)).to(world.device());
    mesh.pp_group().all_reduce(total, dist::ReduceOp::SUM).wait();
    parameters = static_cast<int64_t>(total.cpu().item<double>());
  }
  char line[512];
  const char* tf32 = !job.device.is_cuda() ? "n/a on CPU" : c.train.tf32 ? "on" : "off";
  const char* batch_rank = mesh.tp_size() > 1 || mesh.pp_size() > 1 ? "data-parallel rank" : "rank";
  // On CUDA, which backend the collectives take: NCCL, or Gloo when ranks share a GPU.
  const std::string over = world.size() == 1 || !job.device.is_cuda()
                               ? std::string()
                               : std::string(" over ") + dist::comm_backend_name(world.backend()) + " (" +
                                     job.device.str() + ")";
  std::snprintf(line, sizeof(line), "training %s (%s, %s parameters) on %d rank%s%s, %s, mixed precision %s, tf32 %s, "
                "%lld steps of %lld x %lld x %d samples (per %s x micro-batches x %ss: %lld a step), "
                "peak %.3g TFLOP/s/rank%s",
                job.recipe->flavor().c_str(), job.recipe->family().c_str(), with_commas(parameters).c_str(),
                world.size(), world.size() == 1 ? "" : "s", over.c_str(),
                parallel::to_string(c.parallel.strategy).c_str(),
                parallel::to_string(c.parallel.mixed_precision).c_str(), tf32, static_cast<long long>(c.train.steps),
                static_cast<long long>(c.train.batch_size), static_cast<long long>(c.train.grad_accum), mesh.data_size(),
                batch_rank, batch_rank, static_cast<long long>(c.train.batch_size * c.train.grad_accum * mesh.data_size()),
                peak_tflops,
                c.log.peak_tflops > 0 ? "" : " (measured)");
  job.logger.info(line);
  if (mesh.tp_size() > 1) {
    const std::string stages = mesh.pp_size() > 1 ? std::to_string(mesh.pp_size()) + " pipeline x " : "";
    job.logger.info("  mesh: " + stages + std::to_string(mesh.replicate_size()) + " replicate x " +
                    std::to_string(mesh.shard_size()) + " shard x " + std::to_string(mesh.tp_size()) +
                    " tensor-parallel ranks (a group of " + std::to_string(mesh.tp_size()) + " reads one batch" +
                    (c.parallel.sequence_parallel ? ", sequence parallel" : "") + "); each rank holds" +
                    (pipeline ? " (the first pipeline rank's stages)" : "") + ":");
    for (const std::string& rule : model.tensor_parallel()->describe()) job.logger.info("    " + rule);
  }
  if (model.float8()) job.logger.info("  " + model.float8()->describe());
  if (model.float8() && c.train.fp8_all_gather) {
    job.logger.info("  float8 all-gather: those projections' weights gathered in e4m3 with one scale each (1 byte "
                    "an element)");
  }
  if (pipeline) {
    const pp::ScheduleShape& shape = pipeline->schedule().shape;
    const std::string across = mesh.tp_size() > 1 ? " x " + std::to_string(mesh.tp_size()) + " tensor-parallel" : "";
    std::snprintf(line, sizeof(line), "  pipeline: %s, %d stages over %d ranks (x %d data-parallel%s), %d "
                  "microbatches of %lld samples; bubble %.1f%% by the schedule's figure, %.1f%% simulated (a backward "
                  "twice a forward):", parallel::to_string(shape.kind).c_str(), shape.stages(), shape.ranks,
                  mesh.data_size(), across.c_str(), shape.microbatches,
                  static_cast<long long>(c.train.batch_size / shape.microbatches),
                  100 * pp::nominal_bubble(shape), 100 * pp::simulate(pipeline->schedule()).bubble);
    job.logger.info(line);
    for (const std::string& stage :
         plan::describe_pipeline_stages(plan::model_shape(*job.recipe), pipeline->split(), shape)) {
      job.logger.info("    " + stage);
    }
  }
  if (model.sharded()) {
    job.logger.info(std::string("  units") + (pipeline ? " (the first pipeline rank's)" : "") + ": " +
                    describe_units(model.module()));
  }
  if (c.model.lora.enabled()) {
    const models::LoraTargets t = models::lora_targets(*job.recipe, c.model.lora);
    job.logger.info("  LoRA: " + models::describe_lora(c.model.lora, t) +
                    (c.model.lora.from.empty() ? "" : "; the adapter from " + c.model.lora.from));
  }
  int64_t recomputed = 0;
  for (const auto& item : model.module()->named_modules()) recomputed += nn::is_activation_checkpointed(*item.value());
  if (recomputed > 0) job.logger.info("  activation checkpointing: " + std::to_string(recomputed) + " layers");
  if (!c.model.init_weights.empty()) {
    job.logger.info("  init_weights: " + describe_conversion(c, model.dtype()));
    // As transformers' from_pretrained warns: the task's head the checkpoint lacks, another task's it holds; with
    // model.overrides, whatever the resize added or left out.
    const models::LoadReport& report = model.load_report();
    const bool resized = !c.model.overrides.empty();
    const std::string added = resized ? "a head, or added by model.overrides" : "the " + job.task->name() + " head";
    const std::string left = resized ? "another task's head, or left out by model.overrides" : "another task's head";
    if (!report.initialized.empty()) {
      job.logger.info("  newly initialized (not in init_weights; " + added + "): " + join_names(report.initialized));
    }
    if (!report.unused.empty()) {
      job.logger.info("  unused (in init_weights, " + left + "): " + join_names(report.unused));
    }
    if (!report.mismatched.empty()) {
      job.logger.info("  newly initialized (shape differs from init_weights', model.ignore_mismatched_sizes): " +
                      join_names(report.mismatched));
    }
  }
  if (c.optim.use_kahan_summation && c.optim.name != config::OptimizerKind::ANYPRECISION_ADAMW) {
    job.logger.warning("optim.use_kahan_summation: only optim.name: anyprecision_adamw has Kahan summation; " +
                       config::to_string(c.optim.name) + " ignores it");
  } else if (c.optim.use_kahan_summation && c.model.dtype == config::Dtype::FLOAT32) {
    job.logger.warning("optim.use_kahan_summation with float32 weights: the compensation buffer recovers what bf16 "
                       "weights lose in each update, float32 ones lose next to nothing; it costs its bytes per "
                       "parameter for little (model.dtype: bf16 is what it is for)");
  }
  if (c.optim.relative_step && c.optim.name != config::OptimizerKind::ADAFACTOR) {
    job.logger.warning("optim.relative_step: only optim.name: adafactor has a relative step; " +
                       config::to_string(c.optim.name) + " ignores it");
  } else if (c.optim.relative_step) {
    job.logger.info("  adafactor: relative step min(" + std::string(c.optim.warmup_init ? "1e-6 step" : "1e-2") +
                    ", 1/sqrt(step))" + (c.optim.scale_parameter ? " times the parameter's RMS" : "") +
                    "; optim.lr and optim.schedule are not used");
  }
  if (c.parallel.offload != parallel::Offload::NONE) {
    const bool nvme = c.parallel.offload == parallel::Offload::NVME;
    job.logger.info(std::string("  offload: ") + parallel::to_string(c.parallel.offload) + ": " +
                    (nvme ? "shards and gradients" : "shards, gradients and optimizer state") +
                    (job.device.is_cuda() ? " in CPU memory"
                                          : " in the CPU's host tier, counted apart from the compute tier's peak") +
                    (nvme ? "; AdamW's state on disk under " + c.parallel.nvme_path : ""));
  }
  if (c.parallel.activation_offload) {
    job.logger.info(std::string("  activation_offload: what each layer saves for backward") +
                    (c.parallel.activation_checkpointing ? " (checkpointed: its input)" : "") +
                    (job.device.is_cuda() ? " in pinned CPU memory" : " in the CPU's host tier") +
                    " until its backward, brought back one layer ahead");
  }
  if (plan.peak_bytes > 0) {
    std::snprintf(line, sizeof(line), "  memory model: predicted peak %.3f GiB per rank (%s), by term:",
                  static_cast<double>(plan.peak_bytes) / (1024.0 * 1024 * 1024), plan.peak_phase.c_str());
    job.logger.info(line);
    // The plan's lines after its heading (the job, which the line above gave) and the parameter count: the terms.
    const std::string& text = plan.estimate_text;
    size_t at = text.find('\n');
    if (at != std::string::npos) at = text.find('\n', at + 1);
    while (at != std::string::npos && at + 1 < text.size()) {
      const size_t end = text.find('\n', at + 1);
      const std::string term = text.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
      if (!term.empty()) job.logger.info("  " + term);
      at = end;
    }
  }
  describe_data(data, job.logger);
}

// The memory model's plan for the start-up line; a family it cannot model yet leaves the line out.
RunPlan predicted_plan(const Config& c) {
  try {
    return plan_run(c);
  } catch (const std::invalid_argument&) {
    RunPlan none;
    none.config = c;
    return none;
  }
}

bool due(int64_t step, int64_t interval, int64_t last_step) {
  return (interval > 0 && step % interval == 0) || step == last_step;
}

double peak_memory_gib(const at::Device& device) {
  const memory::MemoryStats stats = device.is_cuda() ? memory::cuda_memory_stats(device.index())
                                                     : memory::cpu_memory_stats();
  return static_cast<double>(stats.peak_bytes) / (1024.0 * 1024.0 * 1024.0);
}

// The run ends after steps that were not finite (train.on_nonfinite): the message has the history.
class NonFiniteStop : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The loop's state from the first step to the last, and what it does at each.
struct Loop {
  const Config& c;
  Job& job;
  const dist::DeviceMesh& mesh;
  StepParts parts;
  TrainingData& data;
  MetricsLog& log;
  const ckpt::CheckpointModel& checkpointed;
  double peak_tflops;
  RunPosition at;
  IntervalSums interval;
  TrainSummary summary;
  NonFinitePolicy nonfinite;
  bool save_due = false;  // a checkpoint due at a step that was not finite waits for the next finite one
  // Seconds when the warm-up steps were done, until the time is estimated.
  std::optional<double> measuring_since = std::nullopt;
  bool estimated = false;
  ckpt::AsyncCheckpointer* writer = nullptr;  // checkpoint.async: the background writer; null: saves block

  int64_t last_step() const { return c.train.stop_at > 0 ? c.train.stop_at : c.train.steps; }

  void run(const PreemptionWatch& preemption) {
    const int64_t warmup_until = at.step + c.log.warmup_steps;
    const int64_t check_every = c.parallel.check_replicas_every;
    if (check_every > 0) {
      const auto& replicas = parts.model.replicas();
      const auto split = parts.model.tensor_split();
      std::string with;
      if (replicas) with = "its replicas' (" + dist::ranks_text(replicas->global_ranks()) + ")";
      if (split) {
        with += (with.empty() ? "" : " and ") + std::string("its tensor-parallel group's where it does not split ") +
                "them (" + dist::ranks_text(split->group.global_ranks()) + ")";
      }
      log.message(with.empty() ? "parallel.check_replicas_every: no other rank holds this rank's parameters under " +
                                     parallel::to_string(c.parallel.strategy) + ": nothing to compare"
                               : "replicas: every " + std::to_string(check_every) + " steps this rank's parameters "
                                 "are compared with " + with + " (parallel.check_replicas_every)");
    }
    if (data.eval_loader && at.step == 0) evaluate();
    if (c.log.warmup_steps == 0) measuring_since = seconds_now();
    while (at.step < last_step()) {
      job.doing("step " + std::to_string(at.step + 1));
      const double t0 = seconds_now();
      const double lr = learning_rate(c.optim, at.step, c.train.steps);
      set_learning_rate(parts.optimizer, lr);
      StepTotals step = train_step(parts, c, data.loader->next_step());
      step.seconds = seconds_now() - t0;
      ++at.step;
      const bool finite = step.nonfinite.empty();
      // A tensor-parallel group's ranks share one batch, and so do a pipeline's: its samples and (the whole
      // model's) FLOPs count on the groups' first rank.
      if (mesh.tp_rank() != 0 || mesh.pp_rank() != 0) step.texts = step.images = 0, step.flops = 0;
      if (finite) interval.add(step, at.step > warmup_until);
      estimate_time(warmup_until);
      log.step_done(at.step, step.loss, peak_memory_gib(job.device));
      if (!finite && !go_on_after(step.nonfinite, /*weights=*/false)) continue;  // rolled back
      if (finite && check_every > 0 && at.step % check_every == 0) check_replicas();  // before anything is saved
      if (due(at.step, c.log.interval, last_step())) log_interval(lr);
      if (data.eval_loader && due(at.step, c.train.eval_interval, last_step())) evaluate();
      save_due = save_due || (!c.checkpoint.dir.empty() && due(at.step, c.checkpoint.interval, last_step()));
      bool saved = false;
      if (save_due && finite) {
        saved = save();
        if (!saved) continue;  // the weights were not finite: rolled back, or skipped until the next save
        save_due = false;
      }
      if (const int sig = preemption.agreed_signal(job.pg.world()); sig != 0 && at.step < last_step()) {
        stop_for(sig, saved || !finite);
        break;
      }
    }
    finish_saving("at the end of the run");
    if (save_due) {
      log.message("no checkpoint after step " + std::to_string(at.step) + ", which was not finite" +
                  (summary.last_checkpoint.empty() ? "" : "; the newest is " + summary.last_checkpoint));
    }
    log.finish();
  }

  // parallel.check_replicas_every: this rank's parameters against its replicas' (dist::compare_replicas); a
  // difference ends the run on every rank, before the step's checkpoint.
  void check_replicas() {
    job.doing("comparing replicas at step " + std::to_string(at.step));
    std::vector<std::pair<std::string, at::Tensor>> named, unsplit;
    const auto split = parts.model.tensor_split();
    for (const auto& p : parts.model.module()->named_parameters()) {
      named.emplace_back(p.key(), p.value());
      if (split && split->params.count(p.value().unsafeGetTensorImpl()) == 0) unsplit.emplace_back(p.key(), p.value());
    }
    // Both comparisons on every rank (each is collective over its group), then the first difference.
    std::optional<dist::ReplicaMismatch> differ, unsplit_differ;
    if (const auto& replicas = parts.model.replicas()) differ = dist::compare_replicas(named, *replicas);
    // Tensor parallelism: the parameters it does not split (norms, a row-split layer's bias) its group holds alike.
    if (split) unsplit_differ = dist::compare_replicas(unsplit, split->group);
    if (!differ) differ = std::move(unsplit_differ);
    if (differ) {
      throw std::runtime_error("step " + std::to_string(at.step) + ": the replicas' parameters differ: " +
                               dist::describe(*differ) + " — a device's or host's memory corrupted them, or a rank "
                               "stepped apart; resume from " +
                               (summary.last_checkpoint.empty() ? "an earlier checkpoint" : summary.last_checkpoint) +
                               " (saved before this step; parallel.check_replicas_every)");
    }
  }

  // A step whose loss or gradient norm was not finite (`what`; its update was not applied), or after which the
  // weights themselves were not (`weights`): skipped, rolled back to the newest verified checkpoint (false: the
  // loop goes on from there), or the end of the run (throws).
  bool go_on_after(const std::string& what, bool weights) {
    const NonFinitePolicy::Action action = weights ? nonfinite.on_nonfinite_weights(at.step, what)
                                                   : nonfinite.on_nonfinite(at.step, what);
    const std::string head = "step " + std::to_string(at.step) + ": " + what;
    if (action == NonFinitePolicy::Action::SKIP) {
      log.warning(head + ": the update was skipped on every rank (" + std::to_string(nonfinite.skipped_in_window()) +
                  " skipped within " + std::to_string(c.train.skip_window) + " steps; more than " +
                  std::to_string(c.train.max_skipped_steps) + " roll back)");
      return true;
    }
    if (action == NonFinitePolicy::Action::ROLLBACK && !c.checkpoint.dir.empty()) {
      job.doing("rollback at step " + std::to_string(at.step));
      finish_saving("before rolling back");  // the newest checkpoint may be the one being written
      const auto back = roll_back(c, at.run_id, checkpointed, parts.scaler, job.pg.world(), job.logger);
      if (back) {
        log.warning(head + ": rolled back to " + back->path + " (rollback " +
                    std::to_string(nonfinite.rollbacks() + 1) + " of at most " +
                    std::to_string(c.train.max_rollbacks) + "); the data of steps " + std::to_string(back->step + 1) +
                    "-" + std::to_string(at.step) + " is skipped");
        nonfinite.rolled_back(at.step, back->step);
        at.step = back->step;
        interval = IntervalSums{};
        save_due = false;
        return false;
      }
    }
    const std::string why = action == NonFinitePolicy::Action::STOP
                                ? (c.train.on_nonfinite == config::NonFinite::STOP
                                       ? "train.on_nonfinite: stop"
                                       : "after " + std::to_string(nonfinite.rollbacks()) + " rollback(s), the most " +
                                             "train.max_rollbacks allows")
                                : "no verified checkpoint of this run to roll back to";
    throw NonFiniteStop(head + ": the run stops (" + why + "). Steps that were not finite: " + nonfinite.history() +
                        ". Lower optim.lr, check the data, or resume from " +
                        (summary.last_checkpoint.empty() ? "an earlier checkpoint" : summary.last_checkpoint));
  }

  // Once, a few steps after the warm-up: how long a step takes and how long the run will.
  void estimate_time(int64_t warmup_until) {
    constexpr int64_t kMeasured = 3;
    if (at.step == warmup_until) measuring_since = seconds_now();
    if (estimated || !measuring_since || at.step != warmup_until + kMeasured || at.step >= last_step()) return;
    const double per_step = (seconds_now() - *measuring_since) / kMeasured;
    const double left = per_step * static_cast<double>(last_step() - at.step);
    char line[160];
    std::snprintf(line, sizeof(line), "time: %.3g s a step (steps %lld-%lld): about %.0f min %02.0f s for the %lld "
                  "steps left", per_step, static_cast<long long>(warmup_until + 1), static_cast<long long>(at.step),
                  std::floor(left / 60), std::fmod(left, 60.0), static_cast<long long>(last_step() - at.step));
    log.message(line);
    estimated = true;
  }

  // SIGTERM/SIGINT reached a rank: every rank saves this step (unless it just did, or the step was not finite) and
  // the run ends.
  void stop_for(int sig, bool saved) {
    if (!saved && !c.checkpoint.dir.empty()) save();
    summary.preempted_by = sig;
    log.message(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + " at step " + std::to_string(at.step) + ": " +
                (c.checkpoint.dir.empty() ? "no checkpoint.dir, nothing saved"
                                          : "saved " + summary.last_checkpoint + "; continue with --resume"));
  }

  void log_interval(double lr) {
    const dist::Communicator& world = job.pg.world();
    IntervalMetrics m = reduce_interval(interval, job.task->loss_names(), peak_memory_gib(job.device), peak_tflops,
                                        world, job.device);
    m.step = at.step, m.lr = lr, m.steps = interval.steps;
    log.record(m);
    if (summary.intervals++ == 0) summary.first_loss = m.loss, summary.first_loss_steps = m.steps;
    summary.last_loss = m.loss;
    interval = IntervalSums{};
  }

  void evaluate() {
    job.doing("evaluation at step " + std::to_string(at.step));
    models::EvalInputs in;
    in.loader = data.eval_loader.get(), in.source_size = data.eval_size();
    in.max_samples = c.train.eval_samples, in.batch_size = c.train.batch_size, in.world = &mesh.data_group();
    in.device = job.device, in.floats = parts.model.dtype();
    if (parts.pipeline) in.pipeline_token_loss = [this](const data::Batch& b) { return parts.pipeline->token_loss(b); };
    const auto values = job.task->evaluate(*parts.model.module(), in);
    if (summary.first_eval.empty()) summary.first_eval = values;
    summary.last_eval = values;
    log.record_eval(at.step, values);
  }

  // Saves this step; false when the weights or optimizer state were not finite (nothing saved, and the run
  // rolled back: go_on_after).
  bool save() {
    job.doing("checkpoint at step " + std::to_string(at.step));
    at.loader = data.loader->state();
    finish_saving("before step " + std::to_string(at.step) + "'s save: one save at a time");
    const double t0 = seconds_now();
    try {
      if (writer) {
        const ckpt::AsyncSaveStarted started =
            start_saving_run(c, at, parts.scaler, checkpointed, job.pg.world(), *writer);
        summary.last_checkpoint = started.path;
        log.message("checkpoint " + started.path + ": " + memory::readable_size(started.staged_bytes) +
                    " staged in " + seconds_text(started.staged_seconds) + ", written in the background");
        return true;
      }
      summary.last_checkpoint = save_run(c, at, parts.scaler, checkpointed, job.pg.world());
    } catch (const ckpt::NonFiniteState& e) {
      go_on_after(e.what(), /*weights=*/true);
      return false;
    }
    log.message("checkpoint " + summary.last_checkpoint + " (saved in " + seconds_text(seconds_now() - t0) + ")");
    return true;
  }

  // checkpoint.async: waits for the save in flight (saying how long when it is still being written, and `before`
  // what), and stops the run when its write failed. Nothing when none is in flight.
  void finish_saving(const std::string& before) {
    if (!writer || !writer->in_flight()) return;
    const bool still_writing = writer->writing();
    const double t0 = seconds_now();
    std::optional<ckpt::AsyncSaveDone> done;
    try {
      done = writer->wait();
    } catch (const ckpt::CheckpointWriteFailed& e) {
      throw ckpt::CheckpointWriteFailed(std::string(e.what()) + "; it was written in the background, and the run " +
                                        "stops at step " + std::to_string(at.step));
    }
    log.message("checkpoint " + done->path + " written (" + seconds_text(done->written_seconds) +
                " in the background" +
                (still_writing ? "; waited " + seconds_text(seconds_now() - t0) + " for it " + before : "") +
                ")");
  }
};

// The closing lines: skipped samples (every rank that had some), then rank 0's summary of the run.
void describe_end(const Loop& loop, const data::LoaderStats& stats) {
  const log::Logger& logger = loop.job.logger;
  if (stats.skipped > 0) {
    logger.info_every_rank("rank " + std::to_string(loop.job.pg.world().rank()) + ": " +
                           std::to_string(stats.skipped) + " unusable samples skipped (replaced by the next ones); " +
                           "first: " + (stats.first_errors.empty() ? "?" : stats.first_errors[0]));
  }
  if (stats.truncated > 0) {
    logger.info_every_rank("rank " + std::to_string(loop.job.pg.world().rank()) + ": " +
                           std::to_string(stats.truncated) + " texts longer than data.max_text_length truncated (" +
                           std::to_string(stats.truncated_tokens) + " tokens cut; data.truncation: error refuses " +
                           "them)");
  }
  const TrainSummary& s = loop.summary;
  char line[160];
  if (s.intervals == 1) {  // one mean: "a -> a" would read as no learning
    std::snprintf(line, sizeof(line), "done: %lld steps, loss %.4f (the mean of the %lld steps logged)",
                  static_cast<long long>(loop.at.step), s.last_loss, static_cast<long long>(s.first_loss_steps));
  } else {
    std::snprintf(line, sizeof(line), "done: %lld steps, loss %.4f -> %.4f", static_cast<long long>(loop.at.step),
                  s.first_loss, s.last_loss);
  }
  std::string text = line;
  if (!s.last_eval.empty()) text += loop.job.task->describe_progress(s.first_eval, s.last_eval);
  if (loop.parts.scaler) {
    std::snprintf(line, sizeof(line), ", loss scale %g (%lld steps skipped for overflowing gradients)",
                  loop.parts.scaler->scale_value(), static_cast<long long>(loop.parts.scaler->skipped_steps()));
    text += line;
  }
  logger.info(text);
  // Where the run's results are, and what to do with them next.
  if (!s.last_checkpoint.empty()) {
    const std::string adapter = loop.c.model.lora.enabled() ? ", or the LoRA adapter alone: --peft DIR" : "";
    logger.info("  checkpoint: " + s.last_checkpoint + " (continue: --resume; export: shardtrain checkpoint export " +
                loop.c.checkpoint.dir + " --out model.safetensors" + adapter + ")");
  }
  if (!loop.c.log.dir.empty()) {
    logger.info("  metrics: " + loop.c.log.dir + " (metrics.csv, TensorBoard events: tensorboard --logdir " +
                loop.c.log.dir + ")");
  }
}

// train.batch_size: auto's limit from the launcher (kAutoBatchLimitEnv: an out-of-memory at a larger batch); 0: none.
int64_t auto_batch_limit_of_env() {
  const char* text = std::getenv(launch::kAutoBatchLimitEnv);
  if (text == nullptr || *text == '\0') return 0;
  try {
    const int64_t limit = std::stoll(text);
    if (limit >= 1) return limit;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string(launch::kAutoBatchLimitEnv) + "='" + text +
                              "': expected a batch of at least 1 (the launcher sets it)");
}

// The smallest of the ranks' limits (0: none): across nodes each launcher gives its own (launch.h). Collective.
int64_t agreed_batch_limit(int64_t mine, const dist::Communicator& world) {
  if (world.size() == 1) return mine;
  constexpr double kNone = 1e15;  // above any batch; exact in float64, as every batch is
  at::Tensor t = at::full({1}, -(mine > 0 ? static_cast<double>(mine) : kNone), at::dtype(at::kDouble));
  t = t.to(world.device());
  world.all_reduce(t, dist::ReduceOp::MAX).wait();  // max of negatives: the smallest limit
  const double smallest = -t.cpu().item<double>();
  return smallest >= kNone ? 0 : static_cast<int64_t>(smallest);
}

// One attempt at the run; `batch_limit` caps train.batch_size: auto (0: no cap).
// `classes_from`: where train() filled data.labels from when the config gave none (RunLabels::from: the dataset's
// ClassLabel, the records' distinct labels), which the start-up says; "" when it did not. `device_note`: what
// train.device: auto became, and why ("" when the config named the device).
TrainSummary train_run(const Config& given, std::shared_ptr<log::Sink> sink, int64_t batch_limit,
                       const std::string& classes_from, const std::string& device_note) {
  Job job(given, std::move(sink));
  // train.batch_size: auto becomes the largest batch the memory model predicts to fit, parallel.layout: auto the
  // planner's layout (every rank computes the same).
  const bool auto_batch = given.train.batch_size == config::kAutoBatch;
  const bool auto_layout = given.parallel.layout == config::Layout::AUTO;
  if (auto_batch) batch_limit = agreed_batch_limit(batch_limit, job.pg.world());
  const RunPlan plan = auto_batch || auto_layout ? plan_run(given, batch_limit) : predicted_plan(given);
  if (!plan.over_budget.empty() && !given.train.force) throw std::invalid_argument(plan.over_budget);
  const Config& c = plan.config;
  const dist::DeviceMesh mesh = make_mesh(c, job);
  // The ranks of one tensor-parallel group read the same batches: the data is split over the data-parallel ranks.
  const dist::Communicator& data_group = mesh.data_group();
  job.task->check_batch_size(c.train.batch_size, data_group.size());
  for (size_t at = 0, end; at < plan.layout_text.size(); at = end + 1) {  // its lines, each ending in '\n'
    end = std::min(plan.layout_text.find('\n', at), plan.layout_text.size());
    job.logger.info(plan.layout_text.substr(at, end - at));
  }
  if (auto_batch) {
    const size_t at = plan.layout_text.size();
    job.logger.info(plan.text.substr(at, plan.text.find('\n', at) - at));
  }
  const dist::Communicator& world = job.pg.world();
  TrainingData data =
      open_training_data(c, *job.task, job.tokenizer, data_group.rank(), data_group.size(), job.logger);
  if (!device_note.empty()) data.notes.push_back(device_note);
  for (const std::string& unused : c.unused_keys) data.notes.push_back(unused);
  if (!classes_from.empty() && job.task->data_needs().num_labels > 0) {
    std::string names;
    for (const auto& name : c.data.labels) names += (names.empty() ? "" : ", ") + name;
    const bool words = job.task->data_needs().word_labels;
    data.notes.push_back(words ? "token classes: [" + names + "], " + classes_from +
                                     " (a class per word, scored on its first token as run_ner)"
                         : c.data.multi_label ? "multi-label: sets of the classes [" + names + "], " + classes_from +
                                                    " (binary cross-entropy on each, as run_classification)"
                         : c.data.labels.size() == 1 ? "regression: one output, " + classes_from + " (as run_glue's "
                                                       "STS-B)"
                                                     : "classes: [" + names + "], " + classes_from);
  }
  // Dropout draws from the default generators, seeded per data-parallel rank (at::manual_seed seeds CPU and every
  // GPU): a tensor-parallel group draws alike, as its replicated activations must.
  at::manual_seed(data::hash_of(static_cast<uint64_t>(c.train.seed), static_cast<uint64_t>(data_group.rank())));
  // A pipeline: the model's layers split into stages (at parallel.pp_split_points, or balanced by FLOPs), this rank
  // building its own only.
  std::vector<models::StageLayers> split;
  if (mesh.pp_size() > 1) {
    split = plan::pipeline_stages(plan::model_shape(*job.recipe), config::pipeline_shape(c).stages(),
                                  c.parallel.pp_split_points);
  }
  ParallelModel model(c, job.recipe, job.task->leaves_parameters_unused(), mesh, job.device,
                      split.empty() ? split : models::stages_of_rank(config::pipeline_shape(c), split, mesh.pp_rank()));
  // float16: the loss is scaled before backward, and a step whose gradients overflowed on any rank is skipped.
  std::optional<optim::GradScaler> scaler;
  if (c.parallel.mixed_precision == parallel::Precision::FP16) scaler.emplace(optim::GradScalerOptions{}, world);
  std::unique_ptr<PipelineStep> pipeline =
      split.empty() ? nullptr : std::make_unique<PipelineStep>(c, model, mesh, split, scaler ? &*scaler : nullptr);
  const auto optimizer = make_optimizer(c, model);
  if (const auto* disk = dynamic_cast<const optim::DiskAdamW*>(optimizer.get())) {
    job.logger.info("  disk tier: " + memory::readable_size(disk->disk_bytes()) + " of AdamW state in a scratch file "
                    "under " + c.parallel.nvme_path + (disk->direct() ? " (O_DIRECT)" : " (buffered: no O_DIRECT there)") +
                    ", streamed through two staging buffers each step");
  }
  // A pipeline stage's model holds its layers only: the Hugging Face file's names are the whole model's.
  const std::shared_ptr<torch::nn::Module> named =
      pipeline ? models::build_model(job.recipe, models::meta_build()).module : model.module();
  ckpt::CheckpointModel checkpointed{
      model.module(), optimizer.get(), model.sharded(),
      c.checkpoint.state_dict_type == config::StateDictType::FULL
          ? models::hf_names_of(*named, model.zoo().names)
          : std::vector<std::pair<std::string, std::string>>{}};
  if (pipeline) checkpointed.pp_group = mesh.pp_group();
  if (const models::TensorParallel* tp = model.tensor_parallel()) {
    checkpointed.tp_group = tp->group();
    checkpointed.tp_split = tp->split_layouts(*model.module());
  }
  checkpointed.offloaded = c.parallel.offload != parallel::Offload::NONE;
  // Watched from before the resume: a signal during start-up stops the run after its first step.
  const PreemptionWatch preemption;
  CheckpointLock lock(c.checkpoint.dir, world, job.logger);  // held until the run ends
  const RunPosition start =
      start_run(c, checkpointed, scaler ? &*scaler : nullptr, world, job.env, job.logger, auto_batch);
  lock.set_run(start.run_id);
  start_loading(data, start.loader);
  // checkpoint.async: the writer threads' group of their own (made by every rank alike), the writer released
  // before the lock.
  std::unique_ptr<ckpt::AsyncCheckpointer> writer;
  if (c.checkpoint.async && !c.checkpoint.dir.empty()) {
    std::vector<int> ranks(static_cast<size_t>(world.size()));
    std::iota(ranks.begin(), ranks.end(), 0);
    writer = std::make_unique<ckpt::AsyncCheckpointer>(*job.pg.new_host_group(ranks, "checkpoint writers"));
  }

  const double peak_tflops = c.log.peak_tflops > 0 ? c.log.peak_tflops : measure_peak_tflops(job.device);
  MetricsLog log(c.log, job.logger, world.rank() == 0, c.train.steps, start.step, job.task->loss_names(),
                 c.train.batch_size * c.train.grad_accum * data_group.size());
  describe_start(c, job, model, mesh, peak_tflops, data, plan, pipeline.get());
  const uint64_t objective_seed = static_cast<uint64_t>(c.train.seed) ^ static_cast<uint64_t>(data_group.rank()) << 32;
  Loop loop{c, job, mesh, StepParts{model, *job.recipe, *job.task, *optimizer, scaler ? &*scaler : nullptr, job.device,
                                    objective_seed, world, pipeline.get()},
            data, log, checkpointed, peak_tflops, start, {}, {}, NonFinitePolicy(c.train)};
  loop.summary.start_step = start.step;
  loop.writer = writer.get();
  try {
    loop.run(preemption);
  } catch (const c10::OutOfMemoryError& e) {
    // The batch was the memory model's guess: one that did not fit in the first two steps is halved (train()).
    // Two: the first step's update creates the optimizer's state (AdamW's moments, 8 B a parameter), so the second
    // is the first to hold everything the model counts at its peak (flava-350m on a GPU capped at 8 GiB completed
    // its first step at batch 32 and ran out in the second, 2026-11-28).
    // A pipeline's batch halves to whole microbatches (plan_run rounds the limit down): none below one each.
    const int64_t least = mesh.pp_size() > 1 ? config::pipeline_shape(c).microbatches : 1;
    if (!auto_batch || loop.at.step > start.step + 1 || c.train.batch_size <= least) throw;
    const int64_t retry = c.train.batch_size / 2;
    const std::string what = e.what_without_backtrace();
    throw AutoBatchOutOfMemory("out of memory in the first two steps at train.batch_size auto's " +
                                   std::to_string(c.train.batch_size) + " per rank (" +
                                   what.substr(0, what.find('\n')) + "); retrying at " + std::to_string(retry),
                               retry);
  } catch (const NonFiniteStop&) {
    throw;
  } catch (const ckpt::CheckpointWriteFailed&) {
    throw;
  } catch (const std::runtime_error& e) {  // a collective that timed out names the waiting rank: add the others
    if (!job.heartbeat) throw;
    throw std::runtime_error(std::string(e.what()) + " (what the ranks last said: " + job.heartbeat->describe_ranks() +
                             ")");
  }

  const data::LoaderStats stats = data.loader->stats();
  loop.summary.steps = loop.at.step;
  loop.summary.skipped_samples = stats.skipped;
  describe_end(loop, stats);
  return loop.summary;
}

}  // namespace

TrainSummary train(const Config& given, std::shared_ptr<log::Sink> sink) {
  // train.device: auto becomes the device a run computes on, and a GPU run loads LibTorch's CUDA part before
  // anything can ask LibTorch about CUDA (shardtrain/cuda/cuda_library.h).
  Config resolved = given;
  resolved.train.device = cuda::resolve_device(given.train.device);
  if (resolved.train.device == parallel::Device::CUDA) cuda::load_cuda();
  const std::string device_note = given.train.device != parallel::Device::AUTO ? ""
                                  : resolved.train.device == parallel::Device::CUDA
                                      ? "device: cuda (train.device: auto; " + std::to_string(cuda::visible_gpus()) +
                                            " GPUs visible)"
                                      : "device: cpu (train.device: auto; no GPU visible)";
  // A classifier's classes from the data when the config names none (run_classes), resolved once: the model is
  // built for them, the data checked against them, and the checkpoints' config (an export's) holds them.
  const RunLabels labels = run_labels(given);
  resolved.data.labels = labels.names, resolved.data.multi_label = labels.multi_label;
  const std::string classes_from = labels.from;
  int64_t batch_limit = auto_batch_limit_of_env();
  const dist::DistEnv env = dist::read_dist_env(dist::process_env_lookup());
  if (const std::string kept = keep_global_batch(resolved, env); !kept.empty()) {
    log::Logger(sink, env.rank).info(kept);
  }
  const bool alone = env.source == dist::EnvSource::NONE || env.world_size == 1;
  while (true) {
    try {
      return train_run(resolved, sink, batch_limit, classes_from, device_note);
    } catch (const AutoBatchOutOfMemory& e) {
      if (!alone) throw;  // the other ranks wait in collectives: the launcher restarts them all (launch.h)
      log::Logger(sink, 0).warning(e.what());
      batch_limit = e.retry_batch;  // every attempt halves the batch: at most log2(batch) of them
    }
  }
}

}  // namespace shardtrain::train
