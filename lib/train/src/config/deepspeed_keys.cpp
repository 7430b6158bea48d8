// A DeepSpeed config (ds_config.json, as Hugging Face Trainer's --deepspeed and Accelerate's deepspeed_config_file
// take it) mapped onto shardtrain's tree: ZeRO's stage as the FSDP strategy, its offload devices, precision, the
// micro-batch, accumulation, clipping, the optimizer and scheduler. DeepSpeed's tuning knobs with no counterpart are
// read and listed in Config::unused_keys with the reason; a key that is neither is refused, named.
#include <fstream>
#include <map>
#include <sstream>

#include "config/fields.h"

namespace shardtrain::config {
namespace {

using Setter = void (*)(Config&, const std::string& where, const std::string& path, const YAML::Node& value);

// {"enabled": true} blocks: bf16 and fp16 set the mixed precision (DeepSpeed's own: bf16/fp16 compute, float32
// masters, as parallel.mixed_precision's).
void bf16_enabled(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (node_bool(where, path, value)) c.parallel.mixed_precision = parallel::Precision::BF16;
}
void fp16_enabled(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (node_bool(where, path, value)) c.parallel.mixed_precision = parallel::Precision::FP16;
}

SHARDTRAIN_CONFIG_KEY(micro_batch, train.batch_size, node_int)
SHARDTRAIN_CONFIG_KEY(accumulation, train.grad_accum, node_int)
SHARDTRAIN_CONFIG_KEY(clipping, train.max_grad_norm, node_double)
SHARDTRAIN_CONFIG_KEY(steps_per_print, log.interval, node_int)
// The old spelling of offload_optimizer: {device: cpu}.
void cpu_offload(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (node_bool(where, path, value) && c.parallel.offload == parallel::Offload::NONE) {
    c.parallel.offload = parallel::Offload::CPU;
  }
}
SHARDTRAIN_CONFIG_KEY(cpu_checkpointing, parallel.activation_offload, node_bool)

// DeepSpeed's optimizers by type: Adam (adam_w_mode, its default, is AdamW) and AdamW as AdamW, SGD as SGD.
void optimizer_type(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  const std::string v = value.IsScalar() ? util::ascii_upper(value.Scalar()) : "";
  if (v == "ADAM" || v == "ADAMW") c.optim.name = OptimizerKind::ADAMW;
  else if (v == "SGD") c.optim.name = OptimizerKind::SGD;
  else bad_value(where, path, value, "an optimizer shardtrain has (Adam, AdamW, SGD; Adafactor: optim.name)");
}
void adam_w_mode(Config&, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (!node_bool(where, path, value)) {
    bad_value(where, path, value, "true (Adam with L2 regularisation is not offered)");
  }
}
SHARDTRAIN_CONFIG_KEY(optimizer_lr, optim.lr, node_double)
void optimizer_betas(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (!value.IsSequence() || value.size() != 2) bad_value(where, path, value, "two numbers [beta1, beta2]");
  c.optim.betas = {node_double(where, path, value[0]), node_double(where, path, value[1])};
}
SHARDTRAIN_CONFIG_KEY(optimizer_eps, optim.eps, node_double)
SHARDTRAIN_CONFIG_KEY(optimizer_weight_decay, optim.weight_decay, node_double)
SHARDTRAIN_CONFIG_KEY(optimizer_momentum, optim.momentum, node_double)

// DeepSpeed's schedulers by type: warm-up then constant (WarmupLR), then linear decay (WarmupDecayLR), then cosine
// (WarmupCosineLR).
void scheduler_type(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  const std::string v = value.IsScalar() ? util::ascii_upper(value.Scalar()) : "";
  if (v == "WARMUPLR") c.optim.schedule = LrSchedule::CONSTANT;
  else if (v == "WARMUPDECAYLR") c.optim.schedule = LrSchedule::LINEAR, c.optim.min_lr_ratio = 0;
  else if (v == "WARMUPCOSINELR") c.optim.schedule = LrSchedule::COSINE;
  else bad_value(where, path, value, "a schedule shardtrain has (WarmupLR, WarmupDecayLR, WarmupCosineLR)");
}
SHARDTRAIN_CONFIG_KEY(warmup_num_steps, optim.warmup_steps, node_int)
SHARDTRAIN_CONFIG_KEY(total_num_steps, train.steps, node_int)
void warmup_min_lr(Config&, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (node_double(where, path, value) != 0) bad_value(where, path, value, "0 (the warm-up starts from 0 here)");
}
void warmup_type(Config&, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (!value.IsScalar() || value.Scalar() != "linear") bad_value(where, path, value, "linear (the warm-up here)");
}
SHARDTRAIN_CONFIG_KEY(cos_min_ratio, optim.min_lr_ratio, node_double)

const std::map<std::string, Setter>& mapped() {
  static const std::map<std::string, Setter> table = {
      {"zero_optimization.stage", zero_stage},
      {"zero_optimization.offload_optimizer.device", offload_device},
      {"zero_optimization.offload_param.device", offload_device},
      {"zero_optimization.offload_optimizer.nvme_path", nvme_path},
      {"zero_optimization.offload_param.nvme_path", nvme_path},
      {"zero_optimization.cpu_offload", cpu_offload},
      {"bf16.enabled", bf16_enabled},
      {"fp16.enabled", fp16_enabled},
      {"train_micro_batch_size_per_gpu", micro_batch},
      {"gradient_accumulation_steps", accumulation},
      {"gradient_clipping", clipping},
      {"steps_per_print", steps_per_print},
      {"activation_checkpointing.cpu_checkpointing", cpu_checkpointing},
      {"optimizer.type", optimizer_type},
      {"optimizer.params.lr", optimizer_lr},
      {"optimizer.params.betas", optimizer_betas},
      {"optimizer.params.eps", optimizer_eps},
      {"optimizer.params.weight_decay", optimizer_weight_decay},
      {"optimizer.params.momentum", optimizer_momentum},
      {"optimizer.params.adam_w_mode", adam_w_mode},
      {"scheduler.type", scheduler_type},
      {"scheduler.params.warmup_num_steps", warmup_num_steps},
      {"scheduler.params.total_num_steps", total_num_steps},
      {"scheduler.params.warmup_max_lr", optimizer_lr},
      {"scheduler.params.warmup_min_lr", warmup_min_lr},
      {"scheduler.params.warmup_type", warmup_type},
      {"scheduler.params.cos_min_ratio", cos_min_ratio},
  };
  return table;
}

// Keys read without effect, by path or by a section ("zero_optimization.*"), with the reason said at start.
const std::vector<std::pair<std::string, std::string>>& without_effect() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"zero_optimization.offload_optimizer.*", "DeepSpeed's staging buffers; the disk tier stages two of its own"},
      {"zero_optimization.offload_param.*", "DeepSpeed's staging buffers; offloaded shards are pinned on GPUs"},
      {"zero_optimization.*",
       "DeepSpeed's communication tuning; FSDP's own: parallel.forward_prefetch, backward_prefetch, "
       "limit_all_gathers"},
      {"fp16.*", "the loss scaler's settings; scaling is dynamic from 2^16, as PyTorch's GradScaler"},
      {"bf16.*", "DeepSpeed's bf16 options"},
      {"activation_checkpointing.*",
       "DeepSpeed's checkpointing API options; checkpointing is parallel.activation_checkpointing"},
      {"optimizer.params.*", "an optimizer option shardtrain's AdamW and SGD do not have"},
      {"scheduler.params.*", "a schedule option shardtrain's do not have"},
      {"train_batch_size", "the global batch is train.batch_size x grad_accum x processes"},
      {"wall_clock_breakdown", "DeepSpeed's timers; the log gives items/s, TFLOP/s and MFU"},
      {"communication_data_type", "the reduction dtype follows parallel.mixed_precision"},
      {"prescale_gradients", "gradients are averaged as FSDP's reduce-scatter does"},
      {"gradient_predivide_factor", "gradients are averaged as FSDP's reduce-scatter does"},
      {"zero_allow_untested_optimizer", "a DeepSpeed safety switch"},
      {"zero_force_ds_cpu_optimizer", "the CPU step is shardtrain's fused AdamW"},
      {"tensorboard.*", "log.dir writes TensorBoard events"},
      {"csv_monitor.*", "log.dir writes metrics.csv"},
      {"wandb.*", "no Weights & Biases here; log.dir's TensorBoard events and metrics.csv"},
      {"flops_profiler.*", "the log's TFLOP/s and MFU come from the model's FLOPs"},
      {"dump_state", "DeepSpeed's debugging"},
  };
  return table;
}

const std::string* reason_without_effect(const std::string& path) {
  for (const auto& [key, reason] : without_effect()) {
    const bool section = key.size() > 2 && key.compare(key.size() - 2, 2, ".*") == 0;
    if (section ? path.rfind(key.substr(0, key.size() - 1), 0) == 0 : path == key) return &reason;
  }
  return nullptr;
}

void apply_leaf(Config& c, const std::string& path, const YAML::Node& value, const std::string& where) {
  // "auto": Hugging Face Trainer fills it from its own arguments; here the shardtrain key keeps its value.
  if (value.IsScalar() && value.Scalar() == "auto") return;
  if (auto it = mapped().find(path); it != mapped().end()) return it->second(c, where, path, value);
  if (const std::string* reason = reason_without_effect(path)) {
    c.unused_keys.push_back(where + ": " + path + ": no effect here (" + *reason + ")");
    return;
  }
  std::vector<std::string> known;
  for (const auto& item : mapped()) known.push_back(item.first);
  throw ConfigError(where + ": DeepSpeed's '" + path + "' has no counterpart in shardtrain (did you mean '" +
                    closest_key(path, known) + "'? docs/guide/config-keys.md lists what maps)");
}

void walk(Config& c, const YAML::Node& node, const std::string& prefix, const std::string& where) {
  for (const auto& item : node) {
    const std::string path = (prefix.empty() ? "" : prefix + ".") + item.first.as<std::string>();
    const bool section = item.second.IsMap() && path != "optimizer.params.betas";
    if (section) walk(c, item.second, path, where);
    else apply_leaf(c, path, item.second, where);
  }
}

}  // namespace

// DeepSpeed's ZeRO stages as FSDP's strategies: 3 shards parameters too (FULL_SHARD), 2 gradients and optimizer
// state (SHARD_GRAD_OP; stage 1, optimizer state alone, has no FSDP strategy of its own: it takes stage 2's, which
// holds less), 0 replicates (DDP).
void zero_stage(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  switch (node_int(where, path, value)) {
    case 0: c.parallel.strategy = parallel::Strategy::DDP; return;
    case 1:
    case 2: c.parallel.strategy = parallel::Strategy::SHARD_GRAD_OP; return;
    case 3: c.parallel.strategy = parallel::Strategy::FULL_SHARD; return;
    default: bad_value(where, path, value, "a ZeRO stage (0, 1, 2 or 3)");
  }
}

// DeepSpeed's offload devices (optimizer's and parameters': none, cpu, nvme) onto parallel.offload, the further of
// the two: the disk tier keeps the optimizer's state on disk and the parameters in host memory, so a parameter
// device of nvme is the disk tier with its parameters in host memory.
void offload_device(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  static const std::map<std::string, parallel::Offload> devices = {
      {"NONE", parallel::Offload::NONE}, {"CPU", parallel::Offload::CPU}, {"NVME", parallel::Offload::NVME}};
  auto it = value.IsScalar() ? devices.find(util::ascii_upper(value.Scalar())) : devices.end();
  if (it == devices.end()) bad_value(where, path, value, "none, cpu or nvme");
  if (static_cast<int>(it->second) > static_cast<int>(c.parallel.offload)) c.parallel.offload = it->second;
}

void nvme_path(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  c.parallel.nvme_path = node_string(where, path, value);
}

bool is_deepspeed_config(const YAML::Node& root) {
  if (!root.IsMap()) return false;
  for (const char* key : {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}) {
    if (root[key]) return true;
  }
  return false;
}

void apply_deepspeed_config(Config& c, const YAML::Node& root, const std::string& where) {
  if (!root.IsMap()) throw ConfigError(where + ": a DeepSpeed config is a JSON object");
  walk(c, root, "", where);
}

void apply_deepspeed_config_file(Config& c, const std::string& path, const std::string& where) {
  std::ifstream in(path);
  if (!in) throw ConfigError(where + ": cannot read the DeepSpeed config '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());  // JSON is YAML
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": not valid JSON: " + e.msg);
  }
  apply_deepspeed_config(c, root, path);
}

}  // namespace shardtrain::config
