#include "train/auto_layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "shardtrain/cuda/cuda_library.h"
#include "shardtrain/memory/memory_size.h"

namespace shardtrain::train {
namespace {

using memory::readable_size;

// What ranks the layouts: a GPU preset's constants, and how the start-up names them.
struct RankedOn {
  plan::Cluster cluster;
  std::string described;  // "NVIDIA H100 80GB HBM3 (the h100 preset)"
  bool preset = false;    // a preset matched this machine's GPU (`shardtrain plan --gpu` names it)
};

// The preset of the GPU this process computes on: the one whose name ("h100", "a100-80gb" without its size) the
// device's name carries, the memory closest to the device's among several; the default preset when none does.
RankedOn this_gpu() {
  const cuda::DeviceProperties device = cuda::device_properties(0);
  std::string name = device.name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const plan::GpuSpec* best = nullptr;
  const std::vector<plan::GpuSpec> specs = plan::gpu_specs();
  for (const plan::GpuSpec& spec : specs) {
    if (name.find(spec.name.substr(0, spec.name.find('-'))) == std::string::npos) continue;
    if (best == nullptr ||
        std::llabs(spec.memory - device.total_bytes) < std::llabs(best->memory - device.total_bytes)) {
      best = &spec;
    }
  }
  if (best == nullptr) {
    return {plan::Cluster{}, device.name + " (no preset of its name: " + plan::Cluster{}.gpu + "'s constants)", false};
  }
  return {plan::with_gpu(plan::Cluster{}, *best), device.name + " (the " + best->name + " preset)", true};
}

RankedOn the_cpu() {
  return {plan::Cluster{}, "the CPU (ranked by " + plan::Cluster{}.gpu + "'s constants: the planner models GPUs)",
          false};
}

// "parallel.strategy: ddp, parallel.activation_checkpointing: false, ..., train.batch_size: 8".
std::string keys_text(const plan::TrainingJob& job, bool batch_auto) {
  std::string out;
  for (const auto& [path, value] : plan::layout_keys(job)) {
    if (batch_auto && (path == "train.batch_size" || path == "train.grad_accum")) continue;
    out += (out.empty() ? "" : ", ") + path + ": " + value;
  }
  return out;
}

}  // namespace

ChosenLayout choose_layout(const config::Config& given, const models::ModelRecipe& recipe,
                           const plan::TrainingJob& job, int64_t budget, const std::string& budget_source,
                           double margin) {
  const RankedOn on = given.train.device == parallel::Device::CUDA ? this_gpu() : the_cpu();
  plan::Cluster cluster = on.cluster;
  cluster.gpus = job.world, cluster.nodes = job.nodes;
  cluster.gpu_memory = budget, cluster.memory_margin = margin;
  cluster.seq_len = given.data.max_text_length;
  cluster.float8 = given.train.fp8, cluster.float8_all_gather = given.train.fp8_all_gather;
  const bool batch_auto = given.train.batch_size == config::kAutoBatch;
  if (!batch_auto) cluster.global_batch = given.train.batch_size * given.train.grad_accum * job.world;
  // The config's precision: its mixed precision (fp16 priced as bf16: the same bytes and peak) and parameter bytes.
  const parallel::Precision mixed = given.parallel.mixed_precision == parallel::Precision::FP16
                                        ? parallel::Precision::BF16
                                        : given.parallel.mixed_precision;
  const int64_t param_bytes = given.model.dtype == config::Dtype::FLOAT32 ? 4 : 2;
  std::vector<plan::PlannedConfig> configs;
  for (plan::PlannedConfig& c : plan::plan_configurations(recipe, cluster)) {
    if (c.job.mixed_precision != mixed || c.job.param_bytes != param_bytes) continue;
    if (c.job.optimizer_on_disk && given.parallel.nvme_path.empty()) continue;  // the disk tier needs a directory
    configs.push_back(std::move(c));
  }
  // "float32", "bf16 mixed precision", "16-bit parameters".
  const std::string precision = param_bytes == 2 ? std::string("16-bit parameters")
                                : mixed == parallel::Precision::NO
                                    ? std::string("float32")
                                    : parallel::to_string(given.parallel.mixed_precision) + " mixed precision";
  if (configs.empty()) {
    throw std::invalid_argument(
        "parallel.layout: auto: no layout of " + given.model.flavor + " on " + std::to_string(job.world) + " rank" +
        (job.world == 1 ? "" : "s") + " fits " + readable_size(budget) + " a rank (" + budget_source + ") less " +
        std::to_string(static_cast<int>(std::lround(margin * 100))) + "% at " + precision +
        (batch_auto ? "" : " and a global batch of " + std::to_string(cluster.global_batch)) +
        ": more ranks, a larger budget, " + (batch_auto ? "" : "a smaller batch, ") + "or LoRA");
  }
  const size_t chosen = plan::recommended(configs);
  const plan::PlannedConfig& pick = configs[chosen];
  ChosenLayout out{given, ""};
  for (const auto& [path, value] : plan::layout_keys(pick.job)) {
    if (batch_auto && (path == "train.batch_size" || path == "train.grad_accum")) continue;
    config::apply_overrides(out.config, {"--" + path + "=" + value});
  }
  // The global batch's split, whatever the config accumulated before (layout_keys leaves out an accumulation of 1).
  if (!batch_auto) out.config.train.grad_accum = std::max<int64_t>(pick.job.grad_accum, 1);
  out.config.parallel.layout = config::Layout::GIVEN;
  char line[512];
  std::snprintf(line, sizeof line, " (#%zu of %zu layouts at %s on %s; predicted %.3g items/s, peak %s of %s (%s) "
                "less %d%%)\n", chosen + 1, configs.size(), precision.c_str(), on.described.c_str(),
                pick.items_per_second, readable_size(pick.memory.peak_bytes).c_str(), readable_size(budget).c_str(),
                budget_source.c_str(), static_cast<int>(std::lround(margin * 100)));
  out.text = "parallel: auto -> " + keys_text(pick.job, batch_auto) + line;
  if (configs.size() > 1) {
    const plan::PlannedConfig& runner = configs[chosen == 0 ? 1 : 0];
    std::snprintf(line, sizeof line, " (%.3g items/s, peak %s)\n", runner.items_per_second,
                  readable_size(runner.memory.peak_bytes).c_str());
    out.text += "  runner-up: " + keys_text(runner.job, batch_auto) + line;
  }
  out.text += "  " + plan::recommendation_reason(configs, chosen);
  if (given.model.overrides.empty() && !given.model.lora.enabled()) {
    const int64_t tokens = given.data.max_text_length;
    std::snprintf(line, sizeof line, "  ranked as `shardtrain plan %s --gpus %lld --nodes %lld%s --gpu-memory %lldB "
                  "--memory-margin %g%s%s` ranks them (its rows at this precision)\n",
                  given.model.flavor.c_str(), static_cast<long long>(job.world), static_cast<long long>(job.nodes),
                  on.preset ? (" --gpu " + cluster.gpu).c_str() : "", static_cast<long long>(budget), margin,
                  tokens > 0 ? (" --seq-len " + std::to_string(tokens)).c_str() : "",
                  batch_auto ? "" : (" --global-batch " + std::to_string(cluster.global_batch)).c_str());
    out.text += line;
  }
  return out;
}

}  // namespace shardtrain::train
