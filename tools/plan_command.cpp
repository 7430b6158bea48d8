// `shardtrain plan MODEL --gpus N --gpu-memory 40GiB`: every configuration that fits, with its largest local batch
// and predicted throughput, best first, and the best as a trainer YAML; `shardtrain plan --figure flava|t5`: the
// seeds' figures from the memory model.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_args.h"
#include "commands.h"
#include "plan_figures.h"
#include "shardtrain/config/config.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/planner.h"

namespace shardtrain::cli {

namespace {

const char* kPlanUsage =
    "usage: shardtrain plan MODEL --gpus N (--gpu NAME | --gpu-memory SIZE) [--nodes M] [--seq-len T] [--top K]\n"
    "                           [--yaml OUT] [--json] [--efficiency E] [--peak-tflops-bf16 X] [--peak-tflops-fp32 X]\n"
    "                           [--intra-node-gbps X] [--inter-node-gbps X] [--pcie-gbps X] [--overlap X]\n"
    "                           [--host-memory SIZE] [--host-memory-gbps X] [--disk-gbps X] [--memory-margin X]\n"
    "                           [--half-efficiency-tokens X] [--half-efficiency-width X]\n"
    "                           [--global-batch N | --global-batch-tokens N]\n"
    "                           [--lora R [--lora-targets a,b]] [--fp8 tensorwise|rowwise]\n"
    "                           [--peak-tflops-fp8 X] [--hbm-gbps X]\n"
    "       shardtrain plan --figure flava|t5|t5-scale|published [--seq-len T] [--json]\n"
    "MODEL: a flavor of `shardtrain models`, a Hugging Face config.json or a model name in the Hugging Face cache.\n"
    "Every configuration (tensor-parallel size within a node x strategy x mixed precision x activation\n"
    "checkpointing of every layer (on), every other (1/2) or none x CPU offload x wrap; precision: bf16 mixed,\n"
    "float32 (no) or pure bf16 with AnyPrecision AdamW (pure); activation offload too\n"
    "where nothing fits without it) that fits SIZE per\n"
    "GPU (40GiB, 80GB, ...) less the margin (default 0.05),\n"
    "with its largest batch per data-parallel rank (the memory model) and predicted items/s, fastest first, at\n"
    "--seq-len tokens (default: the model's maximum, at most 8192);\n"
    "and the one to run as a `shardtrain train` YAML (--yaml OUT writes it): the fastest, or the fastest that\n"
    "splits no layer and offloads nothing when it is within 10% (the model's tolerance). The throughput model\n"
    "and its constants (the GPU's efficiency, overlap 0.8) are in lib/train/include/shardtrain/plan/planner.h;\n"
    "--figure published sets its predictions beside published runs (torchtitan's Llama on A100 and H100).\n"
    "--gpu NAME: the GPU's memory, peak FLOP/s and bandwidths from a preset (a100-40gb, the default; a100-80gb,\n"
    "h100, h200, l40s), each overridable by its flag; the plan's second line says what it assumed.\n"
    "--global-batch N: samples an optimizer step (or --global-batch-tokens: tokens, a multiple of --seq-len):\n"
    "each configuration trains it as micro-batch x accumulation x data-parallel ranks, the largest micro-batch that\n"
    "divides its share and fits; without it each runs at its largest batch, no accumulation.\n"
    "--host-memory SIZE: each node's host memory (default 1TiB), which CPU offload's state must fit;\n"
    "--host-memory-gbps X: the host memory bandwidth a GPU's rank gets for the CPU optimizer step (default 40).\n"
    "Where nothing fits, activation offload is tried, then the optimizer's state on disk (offload: nvme) at\n"
    "--disk-gbps X: the local disk bandwidth a GPU's rank gets, each way (default 2).\n"
    "--lora R: LoRA fine-tuning, rank-R adapters on the base's frozen weights (--lora-targets: PEFT's\n"
    "target_modules; default the query and value projections; all-linear): gradients, optimizer state and\n"
    "reductions of the adapters alone, the YAML's model.lora.\n"
    "--fp8 RECIPE: float8 training (train.fp8), the layers' projections' GEMMs at the GPU's float8 peak\n"
    "(--peak-tflops-fp8; bf16's on a GPU without float8) and their casts at its memory bandwidth (--hbm-gbps);\n"
    "tensorwise under a strategy that shards gathers their weights in float8 (train.fp8_all_gather).\n"
    "--seq-len, --lora, --lora-targets and --fp8 are the trainer's data.max_text_length, model.lora.r,\n"
    "model.lora.target_modules and train.fp8 (the same checks and errors); the other flags describe the cluster.\n"
    "--figure flava: the FLAVA post's Figure 2 (max local batch per flavor for DDP, FSDP, FSDP+AC on 8 x A100-40GB)\n"
    "next to the post's findings; --figure t5: the T5 post's default vs transformer wrapping of T5-3B; --figure\n"
    "t5-scale: the largest T5 per technique on 4 x 8 A100-40GB (DDP+AC, FSDP, +AC, + parameter offload, +\n"
    "activation offload) next to the post's 3B, ~4x and ~20x (81B).\n";

double get_positive(const Args& args, const std::string& name, double fallback) {
  const std::string v = args.get(name, "");
  if (v.empty()) return fallback;
  double d = 0;
  if (parse_number(v, d) && d > 0) return d;
  throw std::invalid_argument("--" + name + ": '" + v + "' (expected a positive number)");
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return text;
}

// The cluster and the throughput model's constants, from the flags (planner.h's defaults for those not given).
plan::Cluster cluster_of_args(const Args& args) {
  plan::Cluster cluster;
  if (args.has("gpu")) cluster = plan::with_gpu(cluster, plan::gpu_spec(args.get("gpu", "")));
  cluster.gpus = args.get_int("gpus", 8);
  cluster.nodes = args.get_int("nodes", 1);
  if (args.has("gpu-memory")) cluster.gpu_memory = memory::parse_memory_size(args.get("gpu-memory", ""));
  if (args.has("host-memory")) cluster.host_memory = memory::parse_memory_size(args.get("host-memory", ""));
  cluster.host_memory_gbps = get_positive(args, "host-memory-gbps", cluster.host_memory_gbps);
  cluster.disk_gbps = get_positive(args, "disk-gbps", cluster.disk_gbps);
  cluster.efficiency = get_positive(args, "efficiency", cluster.efficiency);
  cluster.peak_tflops_bf16 = get_positive(args, "peak-tflops-bf16", cluster.peak_tflops_bf16);
  cluster.peak_tflops_fp32 = get_positive(args, "peak-tflops-fp32", cluster.peak_tflops_fp32);
  cluster.peak_tflops_fp8 = get_positive(args, "peak-tflops-fp8", cluster.peak_tflops_fp8);
  cluster.hbm_gbps = get_positive(args, "hbm-gbps", cluster.hbm_gbps);
  cluster.intra_node_gbps = get_positive(args, "intra-node-gbps", cluster.intra_node_gbps);
  cluster.inter_node_gbps = get_positive(args, "inter-node-gbps", cluster.inter_node_gbps);
  cluster.pcie_gbps = get_positive(args, "pcie-gbps", cluster.pcie_gbps);
  cluster.overlap = get_positive(args, "overlap", cluster.overlap);
  cluster.memory_margin = get_positive(args, "memory-margin", cluster.memory_margin);
  cluster.half_efficiency_tokens = get_positive(args, "half-efficiency-tokens", cluster.half_efficiency_tokens);
  cluster.half_efficiency_width = get_positive(args, "half-efficiency-width", cluster.half_efficiency_width);
  if (cluster.overlap > 1 || cluster.memory_margin >= 1 || cluster.efficiency > 1) {
    throw std::invalid_argument("--overlap, --efficiency and --memory-margin are fractions (expected at most 1)");
  }
  return cluster;
}

// The training side of a plan as the trainer's config keys, each flag an override of its key (as estimate-memory's
// job flags): the model, its LoRA (--lora R: model.lora.r, --lora-targets: model.lora.target_modules), the text
// length (--seq-len: data.max_text_length). The cluster's flags describe hardware, which no config key does.
config::Config job_config(const std::string& model, const Args& args) {
  std::vector<std::string> overrides = {"--model.flavor=" + model};
  if (args.has("seq-len")) overrides.push_back("--data.max_text_length=" + args.get("seq-len", ""));
  if (args.has("fp8")) overrides.push_back("--train.fp8=" + args.get("fp8", ""));
  if (args.has("lora")) overrides.push_back("--model.lora.r=" + args.get("lora", ""));
  if (args.has("lora-targets")) {
    if (!args.has("lora")) throw std::invalid_argument("--lora-targets goes with --lora R");
    overrides.push_back("--model.lora.target_modules=[" + args.get("lora-targets", "") + "]");
  }
  return config::parse_config("", "plan", overrides);
}

// The AC column: every layer checkpointed ("on"), every k-th ("1/k"), none ("").
const char* ac_text(const plan::TrainingJob& job) {
  if (!job.activation_checkpointing) return "";
  return job.checkpoint_every == 2 ? "1/2" : job.checkpoint_every > 2 ? "1/k" : "on";
}

// The configurations that fit, fastest first, the first `top` of them.
void print_table(const std::string& model, const plan::Cluster& cluster,
                 const std::vector<plan::PlannedConfig>& configs, int64_t top) {
  std::printf("%s on %lld GPUs (%lld node%s) of %s GiB, %lld text tokens; fastest first (the planner's model):\n",
              model.c_str(), static_cast<long long>(cluster.gpus), static_cast<long long>(cluster.nodes),
              cluster.nodes > 1 ? "s" : "", gib(cluster.gpu_memory).c_str(),
              static_cast<long long>(configs.front().job.seq_len));
  std::printf("  assuming %s: %.0f TFLOP/s bf16, %.0f TF32, %.0f float8, %.0f GB/s of memory, efficiency %.2f, %.0f "
              "GB/s a GPU within a node, %.1f across nodes, %.0f to the host; host %s GiB a node at %.0f GB/s a GPU "
              "(--gpu and its flags)\n",
              cluster.gpu.c_str(), cluster.peak_tflops_bf16, cluster.peak_tflops_fp32, cluster.peak_tflops_fp8,
              cluster.hbm_gbps, cluster.efficiency,
              cluster.intra_node_gbps, cluster.inter_node_gbps, cluster.pcie_gbps, gib(cluster.host_memory).c_str(),
              cluster.host_memory_gbps);
  std::printf("  %-3s %-11s %-19s %-8s %-3s %-7s %-11s %9s %9s %10s %10s %5s %9s %8s\n", "#", "TP/PP", "strategy",
              "prec",
              "AC", "offload", "wrap", "batch/DP", "peak GiB", "items/s", "tok/s/GPU", "MFU", "TFLOP/s", "step s");
  for (size_t i = 0; i < configs.size() && static_cast<int64_t>(i) < top; ++i) {
    const auto& c = configs[i];
    // "2 SP" (tensor-parallel size, sequence parallel), "PP 4", "PP 4 x 2 SP" (the 3-D mesh), "-".
    const std::string split = c.job.tp > 1 ? std::to_string(c.job.tp) + (c.job.sequence_parallel ? " SP" : "") : "-";
    const std::string tp = c.job.pipeline.ranks <= 1 ? split
                           : "PP " + std::to_string(c.job.pipeline.ranks) + (c.job.tp > 1 ? " x " + split : "");
    const std::string batch =
        std::to_string(c.job.batch) + (c.job.grad_accum > 1 ? " x" + std::to_string(c.job.grad_accum) : "");
    const std::string offload = std::string(c.job.optimizer_on_disk ? "nvme" : c.job.cpu_offload ? "cpu" : "") +
                                (c.job.cpu_offload && c.job.activation_offload ? "+" : "") +
                                (c.job.activation_offload ? "act" : "");
    std::printf("  %-3zu %-11s %-19s %-8s %-3s %-7s %-11s %9s %9s %10.3g %10.0f %4.0f%% %9.1f %8.3f\n", i + 1,
                tp.c_str(),
                (parallel::to_string(c.job.strategy) + (c.job.sync_each_batch ? ", each" : "")).c_str(),
                (std::string(c.job.param_bytes == 2 ? "pure" : parallel::to_string(c.job.mixed_precision)) +
                 (c.job.float8 ? "+f8" : "")).c_str(), ac_text(c.job),
                offload.c_str(),
                c.job.strategy == parallel::Strategy::DDP ? "-" : parallel::to_string(c.job.wrap).c_str(),
                batch.c_str(), gib(c.memory.peak_bytes).c_str(), c.items_per_second,
                c.tokens_per_second_per_gpu, 100 * c.mfu, c.tflops_per_gpu, c.step_seconds);
  }
}

}  // namespace

int run_plan_command(const std::vector<std::string>& argv) {
  const Args args = parse_args(argv,
                               {"gpus", "gpu", "gpu-memory", "nodes", "seq-len", "top", "yaml", "figure",
                                "efficiency", "peak-tflops-bf16", "peak-tflops-fp32", "intra-node-gbps",
                                "inter-node-gbps", "pcie-gbps", "host-memory", "host-memory-gbps", "disk-gbps", "overlap",
                                "memory-margin", "half-efficiency-tokens", "global-batch", "global-batch-tokens",
                                "lora", "lora-targets", "fp8", "peak-tflops-fp8", "hbm-gbps"},
                               {"help", "json"});
  if (args.has("help")) {
    std::cout << kPlanUsage;
    return 0;
  }
  if (args.has("figure")) {
    const std::string figure = args.get("figure", "");
    if (figure != "flava" && figure != "t5" && figure != "t5-scale" && figure != "published") {
      throw std::invalid_argument("--figure: '" + figure + "' (expected flava, t5, t5-scale or published)");
    }
    const int64_t tokens = args.get_int("seq-len", figure == "flava" ? 77 : 512);
    const FigureTable table = figure == "flava"      ? flava_figure(tokens)
                              : figure == "t5"       ? t5_figure(tokens)
                              : figure == "t5-scale" ? t5_scale_figure(tokens)
                                                     : published_figure();
    std::cout << (args.has("json") ? table.json + "\n" : table.text);
    return 0;
  }
  if (args.positionals.size() != 1) {
    std::cerr << kPlanUsage;
    throw std::invalid_argument("expected one MODEL (a flavor or a config.json), got " +
                                std::to_string(args.positionals.size()) + " arguments");
  }
  if (!args.has("gpus") || (!args.has("gpu-memory") && !args.has("gpu"))) {
    throw std::invalid_argument("--gpus and --gpu (or --gpu-memory) are required (e.g. --gpus 8 --gpu h100, or "
                                "--gpus 8 --gpu-memory 40GiB)");
  }
  const std::string model = args.positionals[0];
  const config::Config job = job_config(model, args);
  plan::Cluster cluster = cluster_of_args(args);
  cluster.seq_len = job.data.max_text_length;
  cluster.float8 = job.train.fp8;
  if (args.has("global-batch") && args.has("global-batch-tokens")) {
    throw std::invalid_argument("--global-batch and --global-batch-tokens say the same thing: give one");
  }
  const models::LoraSpec& lora = job.model.lora;
  const auto recipe = models::with_lora(models::recipe_of_model(job.model.flavor, job.model.overrides), lora);
  if (args.has("global-batch")) cluster.global_batch = args.get_int("global-batch", 0);
  if (args.has("global-batch-tokens")) {
    const int64_t tokens = args.get_int("global-batch-tokens", 0);
    const int64_t length = cluster.seq_len > 0 ? cluster.seq_len : plan::default_tokens(*recipe);
    if (tokens % length != 0) {
      throw std::invalid_argument("--global-batch-tokens " + std::to_string(tokens) + " is not a multiple of the " +
                                  std::to_string(length) + " tokens of a sample (--seq-len)");
    }
    cluster.global_batch = tokens / length;
  }
  if ((args.has("global-batch") || args.has("global-batch-tokens")) && cluster.global_batch < 1) {
    throw std::invalid_argument("--global-batch: expected 1 or more samples");
  }
  const std::vector<plan::PlannedConfig> configs = plan::plan_configurations(*recipe, cluster);
  std::string adapted;
  if (lora.enabled()) adapted = " + " + models::lora_label(lora, models::lora_targets(*recipe, lora));
  if (configs.empty()) {
    std::cout << model << adapted << " fits no configuration on " << cluster.gpus << " GPUs of "
              << gib(cluster.gpu_memory) << " GiB: not even one sample per GPU with full sharding, checkpointing and "
              << "CPU and activation offload\n";
    return 1;
  }
  if (args.has("json")) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& c : configs) {
      j.push_back({{"tp_size", c.job.tp}, {"sequence_parallel", c.job.sequence_parallel},
                   {"pp_size", c.job.pipeline.ranks}, {"sync_each_batch", c.job.sync_each_batch},
                   {"strategy", parallel::to_string(c.job.strategy)}, {"mixed_precision", parallel::to_string(c.job.mixed_precision)},
                   {"pure_bf16", c.job.param_bytes == 2},
                   {"fp8", c.job.float8 ? parallel::to_string(*c.job.float8) : "none"},
                   {"fp8_all_gather", c.job.float8_all_gather},
                   {"activation_checkpointing", c.job.activation_checkpointing},
                   {"activation_checkpointing_every", c.job.checkpoint_every}, {"cpu_offload", c.job.cpu_offload},
                   {"activation_offload", c.job.activation_offload}, {"optimizer_on_disk", c.job.optimizer_on_disk},
                   {"disk_bytes", c.memory.disk_bytes},
                   {"wrap", parallel::to_string(c.job.wrap)}, {"batch", c.job.batch}, {"grad_accum", c.job.grad_accum},
                   {"peak_bytes", c.memory.peak_bytes},
                   {"items_per_second", c.items_per_second}, {"step_seconds", c.step_seconds},
                   {"optimizer_seconds", c.optimizer_seconds}, {"host_bytes", c.memory.host_bytes},
                   {"tokens_per_second_per_gpu", c.tokens_per_second_per_gpu}, {"mfu", c.mfu},
                   {"tflops_per_gpu", c.tflops_per_gpu}});
      if (c.job.pipeline.ranks > 1) {  // the trainer's parallel.pp_schedule and pp_microbatches
        j.back()["pp_schedule"] = parallel::to_string(c.job.pipeline.kind);
        j.back()["pp_microbatches"] = c.job.pipeline.microbatches;
      }
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  print_table(model + adapted, cluster, configs, args.get_int("top", 20));
  const int64_t longest = recipe->task()->data_needs().max_text_length;
  if (cluster.seq_len == 0 && longest > plan::default_tokens(*recipe)) {
    std::cout << "(" << plan::default_tokens(*recipe) << " tokens: the model reads up to " << longest
              << ", a length for inference; --seq-len sets the training length)\n";
  }
  const size_t chosen = plan::recommended(configs);
  std::cout << plan::recommendation_reason(configs, chosen);
  const std::string yaml = plan::trainer_yaml(model, configs[chosen], lora);
  std::cout << "\nrecommended (#" << chosen + 1 << "):\n" << yaml;
  if (args.has("yaml")) {
    std::ofstream out(args.get("yaml", ""));
    if (!(out << yaml)) throw std::runtime_error("cannot write " + args.get("yaml", ""));
  }
  return 0;
}

}  // namespace shardtrain::cli
