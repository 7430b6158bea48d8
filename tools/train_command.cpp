// `shardtrain train CONFIG.yaml [--resume] [--section.key=value ...]`.
// Under a launcher (RANK set: `shardtrain launch`, torchrun, MPI, Slurm) each process is one rank. Started
// directly with launch.num_processes > 1, it starts its own workers (as `accelerate launch` does) by running
// `shardtrain launch` on itself.
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <iostream>
#include <set>

#include "cli_args.h"
#include "commands.h"
#include "progress_relay.h"
#include "shardtrain/config/config.h"
#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/data/pipeline/source.h"
#include "shardtrain/io/files.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/launch/error_file.h"
#include "shardtrain/launch/launch.h"
#include "shardtrain/memory/memory_size.h"
#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/plan/memory_model.h"
#include "shardtrain/pp/schedule.h"
#include "shardtrain/train/trainer.h"

namespace shardtrain::cli {
namespace {

const char* kTrainUsage =
    "usage: shardtrain train CONFIG.yaml [--resume] [--dry-run] [--print-schedule] [--section.key=value ...]\n"
    "Trains the model the config names on its data, sharded over the processes of the job. Every config key\n"
    "can be overridden on the command line (--train.steps=100, --parallel.strategy=shard_grad_op); Accelerate\n"
    "config keys are accepted too. --resume = --checkpoint.resume=true (auto: resume when there is a\n"
    "checkpoint). `shardtrain config --default` writes a config with every key. With launch.num_processes > 1\n"
    "and no launcher around it, it starts the workers (launch.max_restarts: restarts that resume).\n"
    "SIGTERM or SIGINT ends the run after the current step with a checkpoint, exit code 75.\n"
    "--dry-run prints the memory model's plan (bytes per rank by term, the batch: train.batch_size may be auto)\n"
    "and a verdict: whether it fits and the data is there (exit 0) or not, with what would fit (exit 1).\n"
    "It trains nothing.\n"
    "--print-schedule prints the pipeline the parallel.pp_* keys describe: the model's layers by stage, the\n"
    "schedule's bubble (its figure and simulated) and every rank's list of actions; it trains nothing.\n";

std::string self_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw std::runtime_error("cannot find the shardtrain executable (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(n));
}

// Whether this process is one rank of a job a launcher started (`shardtrain launch`, torchrun, mpirun, srun). A
// RANK and WORLD_SIZE that no launcher set (no LOCAL_RANK, no job id: a stray `RANK=0 WORLD_SIZE=1` left in a
// shell) whose world is not launch.num_processes do not override the config: the workers are started, and get
// their own.
bool launched_as_a_worker(const config::Config& config) {
  const dist::EnvLookup lookup = dist::process_env_lookup();
  const dist::DistEnv env = dist::read_dist_env(lookup);
  if (env.source == dist::EnvSource::NONE) return false;
  if (env.source != dist::EnvSource::TORCHRUN || config.launch.num_processes <= 1 ||
      env.world_size == config.launch.num_processes) {
    return true;
  }
  for (const char* name : {"LOCAL_RANK", "SHARDTRAIN_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    if (lookup(name).value_or("") != "") return true;
  }
  std::cerr << "shardtrain train: RANK=" << env.rank << " WORLD_SIZE=" << env.world_size
            << " in the environment were not set by a launcher (no LOCAL_RANK, SHARDTRAIN_JOB_ID or "
            << "TORCHELASTIC_RUN_ID beside them) and disagree with launch.num_processes: "
            << config.launch.num_processes << "; starting " << config.launch.num_processes << " workers\n";
  return false;
}

// An explicit train.batch_size the memory model predicts not to fit (RunPlan::over_budget), unless train.force. A
// model the memory model cannot describe is left to the run.
void refuse_a_batch_that_cannot_fit(const config::Config& config) {
  if (config.train.force || config.train.batch_size == config::kAutoBatch) return;
  std::string over;
  try {
    over = train::plan_run(config).over_budget;
  } catch (const std::invalid_argument&) {
    return;
  }
  if (!over.empty()) throw std::invalid_argument(over);
}

// `--dry-run`'s last lines: whether the job fits what a rank has (and by how much) and whether its data is where
// the config says. 0 when it would start, 1 otherwise.
int dry_run_verdict(const config::Config& config, const train::RunPlan& plan) {
  std::vector<std::string> problems;
  for (const auto* paths : {&config.data.image_text, &config.data.text, &config.data.image, &config.data.eval}) {
    if (paths->empty()) continue;
    try {
      data::expand_paths(*paths);
    } catch (const std::invalid_argument& e) {
      problems.push_back(e.what());
    }
  }
  if (!config.data.vocab.empty() && !io::path_exists(config.data.vocab)) {
    problems.push_back("data.vocab: '" + config.data.vocab + "' does not exist");
  }
  if (!plan.over_budget.empty()) problems.push_back("does not fit: " + plan.over_budget);
  for (const auto& problem : problems) std::cout << "verdict: " << problem << "\n";
  if (!problems.empty()) return 1;
  std::string line = "verdict: fits: predicted peak " + memory::readable_size(plan.peak_bytes) + " per rank (" +
                     plan.peak_phase + ")";
  if (plan.budget_bytes > 0) {
    line += ", " + std::to_string(100 * plan.peak_bytes / plan.budget_bytes) + "% of " +
            memory::readable_size(plan.budget_bytes) + " (" + plan.budget_source + ")";
  }
  std::cout << line << "; the data is where the config says\n";
  return 0;
}

// `--print-schedule`: the stages the model's layers make (the embeddings on the first; the head, balanced with its
// FLOPs, on the last), the schedule's bubble by its own figure and simulated with a backward twice a forward, and
// every rank's actions.
int print_schedule(const config::Config& config) {
  const pp::ScheduleShape shape = config::pipeline_shape(config);
  const pp::Schedule schedule = pp::make_schedule(shape);
  const auto recipe = models::recipe_of_model(config.model.from.empty() ? config.model.flavor : config.model.from,
                                              config.model.overrides);
  const plan::ModelShape model = plan::model_shape(*recipe);
  const int stages = shape.stages();
  const int64_t layers = static_cast<int64_t>(model.layer_numel.size());
  if (stages > layers) {
    throw std::invalid_argument("parallel.pp_size " + std::to_string(shape.ranks) + " x pp_stages_per_rank " +
                                std::to_string(shape.stages_per_rank) + " = " + std::to_string(stages) +
                                " stages, but " + recipe->flavor() + " has " + std::to_string(layers) +
                                " layers: at most " + std::to_string(layers) + " stages, one layer each at least");
  }
  const std::vector<models::StageLayers> split =
      plan::pipeline_stages(model, stages, config.parallel.pp_split_points);
  const int64_t per_microbatch = config.train.batch_size / shape.microbatches;
  std::printf("pipeline: %s, %d ranks x %d stage(s), %d microbatches of %lld samples (train.batch_size %lld); "
              "bubble %.1f%% by the schedule's figure, %.1f%% simulated (a backward twice a forward)\n",
              parallel::to_string(shape.kind).c_str(), shape.ranks, shape.stages_per_rank, shape.microbatches,
              static_cast<long long>(per_microbatch), static_cast<long long>(config.train.batch_size),
              100 * pp::nominal_bubble(shape), 100 * pp::simulate(schedule).bubble);
  for (const std::string& line : plan::describe_pipeline_stages(model, split, shape)) std::printf("  %s\n", line.c_str());
  std::cout << schedule.text();
  return 0;
}

}  // namespace

int run_train_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kTrainUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string path = args[0];
  std::set<std::string> flags;
  std::vector<std::string> overrides =
      config_overrides(args, 1, {"--dry-run", "--resume", "--print-schedule"}, &flags);
  if (flags.count("--resume")) overrides.push_back("--checkpoint.resume=true");
  const bool dry_run = flags.count("--dry-run") > 0;
  const config::Config config = config::load_config(path, overrides);
  config::validate(config);  // here, once, before any worker starts (each would say it again)
  if (flags.count("--print-schedule")) return print_schedule(config);
  if (dry_run) {
    const train::RunPlan plan = train::plan_run(config);
    std::cout << plan.text;
    return dry_run_verdict(config, plan);
  }

  const bool under_launcher = launched_as_a_worker(config);
  if (!under_launcher && config.launch.num_processes > 1) {
    // Before any worker starts: a GPU asked for where there is none, a batch that cannot fit.
    if (config.train.device == parallel::Device::CUDA && cuda::visible_gpus() == 0) {
      throw std::invalid_argument("train.device: 'cuda' but this machine has no visible CUDA device (auto, the "
                                  "default, takes the CPU then)");
    }
    refuse_a_batch_that_cannot_fit(config);
    launch::LaunchOptions o;
    o.nnodes = static_cast<int>(config.launch.num_machines);
    o.nproc_per_node = static_cast<int>(config.launch.num_processes / config.launch.num_machines);
    o.node_rank = static_cast<int>(config.launch.machine_rank);
    o.master_addr = config.launch.main_process_ip;
    o.master_port = static_cast<int>(config.launch.main_process_port);
    o.master_port_option = "launch.main_process_port";
    o.max_restarts = static_cast<int>(config.launch.max_restarts);
    o.rdzv_id = config.launch.rdzv_id;
    o.gpu_ids = config.launch.gpu_ids;
    o.preempt_grace = std::chrono::milliseconds(static_cast<int64_t>(config.launch.preempt_grace * 1000.0));
    o.command = {self_executable(), "train"};
    o.command.insert(o.command.end(), args.begin(), args.end());
    return launch::run_launch(o);
  }
  try {
    const train::TrainSummary summary = train::train(config, train_console_sink());
    return summary.preempted_by != 0 ? launch::kPreemptedExitCode : 0;
  } catch (const train::AutoBatchOutOfMemory& e) {  // one of several ranks: the launcher restarts them all smaller
    std::cerr << "shardtrain train: " << e.what() << "\n";
    launch::record_error(e.what(), {{launch::kRetryBatchKey, std::to_string(e.retry_batch)}});
    return launch::kOutOfMemoryExitCode;
  }
}

}  // namespace shardtrain::cli
