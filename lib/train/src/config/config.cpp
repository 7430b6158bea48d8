// The config tree's fields, YAML reading and writing, overrides. Accelerate's keys: accelerate_keys.cpp.
#include "shardtrain/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "config/fields.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/hf_cache.h"
#include "shardtrain/launch/launch.h"
#include "shardtrain/memory/memory_size.h"
#include "shardtrain/util/closest_match.h"
#include "shardtrain/util/ascii_case.h"

namespace shardtrain::config {
namespace {

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

// "file.yaml:12" for a node that came from a file, else the source alone (an override).
std::string where_of(const std::string& source, const YAML::Node& node) {
  const auto mark = node.Mark();
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1);
}

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

[[noreturn]] void bad_value(const std::string& where, const std::string& path, const YAML::Node& node,
                            const std::string& expected) {
  throw ConfigError(where + ": " + path + ": " + scalar_text(node) + " is not " + expected);
}

int64_t to_int(const std::string& where, const std::string& path, const YAML::Node& node) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    try {
      size_t used = 0;
      const long long v = std::stoll(s, &used, 10);
      if (used == s.size()) return v;
      const double d = std::stod(s, &used);  // 1e8 is a fine way to write a count
      if (used == s.size() && std::floor(d) == d && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
    } catch (const std::exception&) {
    }
  }
  bad_value(where, path, node, "an integer");
}

double to_double(const std::string& where, const std::string& path, const YAML::Node& node) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    try {
      size_t used = 0;
      const double v = std::stod(s, &used);
      if (used == s.size() && std::isfinite(v)) return v;
    } catch (const std::exception&) {
    }
  }
  bad_value(where, path, node, "a number");
}

bool to_bool(const std::string& where, const std::string& path, const YAML::Node& node) {
  if (node.IsScalar()) {
    std::string s = node.Scalar();
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  bad_value(where, path, node, "true or false");
}

std::string to_str(const std::string& where, const std::string& path, const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsNull()) return "";
  bad_value(where, path, node, "a string");
}

// A list; a single scalar is a list of one, and a comma-separated string (Accelerate's
// fsdp_transformer_layer_cls_to_wrap: "BertLayer,BertEmbeddings") splits when `split_commas`.
std::vector<std::string> to_strings(const std::string& where, const std::string& path, const YAML::Node& node,
                                    bool split_commas) {
  std::vector<std::string> out;
  auto add = [&](const std::string& s) {
    if (!split_commas) {
      out.push_back(s);
      return;
    }
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) {
      const auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
      if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    }
  };
  if (node.IsNull()) return out;
  if (node.IsScalar()) {
    add(node.Scalar());
    return out;
  }
  if (!node.IsSequence()) bad_value(where, path, node, "a list of strings");
  for (const auto& item : node) {
    if (!item.IsScalar()) bad_value(where, path, item, "a string (in a list of strings)");
    add(item.Scalar());
  }
  return out;
}

std::vector<double> to_doubles(const std::string& where, const std::string& path, const YAML::Node& node) {
  if (!node.IsSequence()) bad_value(where, path, node, "a list of numbers");
  std::vector<double> out;
  for (const auto& item : node) out.push_back(to_double(where, path, item));
  return out;
}

// A double as the shortest text that reads back to it (0.9, not 0.90000000000000002), as a YAML scalar.
YAML::Node shortest(double v) {
  char text[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return YAML::Node(std::string(text));
}

// "train.steps" -> {"train", "steps"}.
std::vector<std::string> path_parts(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  return parts;
}

template <class E>
Field choice(std::string path, E& ref, std::vector<std::pair<std::string, E>> names) {
  Field f;
  f.path = std::move(path);
  for (const auto& n : names) f.choices.push_back(n.first);
  f.set = [&ref, names](const std::string& where, const std::string& p, const YAML::Node& node) {
    if (node.IsScalar()) {
      const std::string v = util::ascii_lower(node.Scalar());
      for (const auto& [name, value] : names) {
        if (v == name) {
          ref = value;
          return;
        }
      }
    }
    std::vector<std::string> all;
    for (const auto& n : names) all.push_back(n.first);
    bad_value(where, p, node, "one of " + join(all, ", "));
  };
  f.get = [&ref, names]() {
    for (const auto& [name, value] : names) {
      if (value == ref) return YAML::Node(name);
    }
    return YAML::Node();
  };
  return f;
}

Field field(std::string path, int64_t& ref) {
  return {std::move(path), [&ref](auto& w, auto& p, auto& n) { ref = to_int(w, p, n); },
          [&ref] { return YAML::Node(ref); }, {}};
}
Field field(std::string path, double& ref) {
  return {std::move(path), [&ref](auto& w, auto& p, auto& n) { ref = to_double(w, p, n); },
          [&ref] { return shortest(ref); }, {}};
}
Field field(std::string path, bool& ref) {
  return {std::move(path), [&ref](auto& w, auto& p, auto& n) { ref = to_bool(w, p, n); },
          [&ref] { return YAML::Node(ref); }, {}};
}
Field field(std::string path, std::string& ref) {
  return {std::move(path), [&ref](auto& w, auto& p, auto& n) { ref = to_str(w, p, n); },
          [&ref] { return YAML::Node(ref); }, {}};
}
// A memory size in bytes, written as people write it ("40GiB", "512MiB", "4096B"; empty: 0, none).
Field memory_size(std::string path, int64_t& ref) {
  return {std::move(path),
          [&ref](auto& w, auto& p, auto& n) {
            const std::string text = to_str(w, p, n);
            try {
              ref = text.empty() ? 0 : memory::parse_memory_size(text);
            } catch (const std::invalid_argument&) {
              bad_value(w, p, n, "a positive number with a unit: 40GiB, 80GB, 512MiB, or bytes as 4096B");
            }
          },
          [&ref] { return YAML::Node(memory::memory_size_text(ref)); }, {}};
}
Field field(std::string path, std::vector<std::string>& ref) {
  return {std::move(path), [&ref](auto& w, auto& p, auto& n) { ref = to_strings(w, p, n, false); },
          [&ref] {
            YAML::Node n(YAML::NodeType::Sequence);
            for (const auto& s : ref) n.push_back(s);
            return n;
          }, {}};
}
Field field(std::string path, std::map<std::string, double>& ref) {
  return {std::move(path),
          [&ref](auto& w, auto& p, auto& n) {
            ref.clear();
            if (n.IsNull()) return;
            if (!n.IsMap()) bad_value(w, p, n, "a mapping of names to numbers ({layers: 4, dim: 512})");
            for (const auto& item : n) ref[item.first.template as<std::string>()] = to_double(w, p, item.second);
          },
          [&ref] {
            YAML::Node n(YAML::NodeType::Map);
            for (const auto& [k, v] : ref) n[k] = shortest(v);
            return n;
          }, {}};
}
Field field(std::string path, std::vector<int64_t>& ref) {
  return {std::move(path),
          [&ref](auto& w, auto& p, auto& n) {
            ref.clear();
            if (n.IsNull()) return;
            if (!n.IsSequence()) bad_value(w, p, n, "a list of whole numbers ([4, 8])");
            for (const auto& item : n) ref.push_back(to_int(w, p, item));
          },
          [&ref] {
            YAML::Node n(YAML::NodeType::Sequence);
            for (int64_t v : ref) n.push_back(v);
            n.SetStyle(YAML::EmitterStyle::Flow);
            return n;
          }, {}};
}
Field field(std::string path, std::vector<double>& ref) {
  return {std::move(path), [&ref](auto& w, auto& p, auto& n) { ref = to_doubles(w, p, n); },
          [&ref] {
            YAML::Node n(YAML::NodeType::Sequence);
            for (double d : ref) n.push_back(shortest(d));
            return n;
          }, {}};
}

// parallel.cpu_offload, FSDP's name for offload: cpu: true says at least cpu (nvme stays nvme), false leaves nvme.
Field cpu_offload_alias(std::string path, parallel::Offload& ref) {
  return {std::move(path),
          [&ref](auto& w, auto& p, auto& n) {
            const bool on = to_bool(w, p, n);
            if (on && ref == parallel::Offload::NONE) ref = parallel::Offload::CPU;
            if (!on && ref == parallel::Offload::CPU) ref = parallel::Offload::NONE;
          },
          [&ref] { return YAML::Node(ref != parallel::Offload::NONE); }, {}};
}

// The run's vocabulary (parallel/vocabulary.h), in the config's spelling.
template <class E>
std::vector<std::pair<std::string, E>> table_of(const std::vector<std::string>& names, E (*named)(const std::string&)) {
  std::vector<std::pair<std::string, E>> out;
  for (const std::string& n : names) out.emplace_back(n, named(n));
  return out;
}
const std::vector<std::pair<std::string, OptimizerKind>> kOptimizers = {
    {"adamw", OptimizerKind::ADAMW}, {"anyprecision_adamw", OptimizerKind::ANYPRECISION_ADAMW},
    {"adafactor", OptimizerKind::ADAFACTOR}, {"sgd", OptimizerKind::SGD}};

}  // namespace

std::vector<std::pair<std::string, Dtype>> dtype_names() {
  return {{"float32", Dtype::FLOAT32}, {"bfloat16", Dtype::BFLOAT16}, {"float16", Dtype::FLOAT16},
          {"fp32", Dtype::FLOAT32},    {"bf16", Dtype::BFLOAT16},     {"fp16", Dtype::FLOAT16}};
}

namespace {

// Each section's keys, in the order `config --default` prints them.
std::vector<Field> model_fields(Config& c) {
  return {
      field("model.flavor", c.model.flavor),
      field("model.family", c.model.family),
      field("model.overrides", c.model.overrides),
      field("model.task", c.model.task),
      field("model.init_weights", c.model.init_weights),
      field("model.ignore_mismatched_sizes", c.model.ignore_mismatched_sizes),
      field("model.init_std", c.model.init_std),
      field("model.from", c.model.from),
      choice("model.dtype", c.model.dtype, dtype_names()),
      field("model.lora.r", c.model.lora.r),
      field("model.lora.lora_alpha", c.model.lora.lora_alpha),
      field("model.lora.lora_dropout", c.model.lora.lora_dropout),
      field("model.lora.target_modules", c.model.lora.target_modules),
      field("model.lora.modules_to_save", c.model.lora.modules_to_save),
      field("model.lora.from", c.model.lora.from),
  };
}
std::vector<Field> data_fields(Config& c) {
  return {
      field("data.image_text", c.data.image_text),
      field("data.text", c.data.text),
      field("data.image", c.data.image),
      field("data.eval", c.data.eval),
      field("data.tokenizer", c.data.tokenizer),
      field("data.vocab", c.data.vocab),
      field("data.text_fields", c.data.text_fields),
      field("data.label_field", c.data.label_field),
      field("data.image_field", c.data.image_field),
      field("data.labels", c.data.labels),
      field("data.multi_label", c.data.multi_label),
      field("data.label_all_tokens", c.data.label_all_tokens),
      field("data.mix.image_text", c.data.mix.image_text),
      field("data.mix.text", c.data.mix.text),
      field("data.mix.image", c.data.mix.image),
      field("data.max_text_length", c.data.max_text_length),
      field("data.truncation", c.data.truncation),
      field("data.padding", c.data.padding),
      field("data.packing", c.data.packing),
      field("data.packing_eos", c.data.packing_eos),
      field("data.cache_dir", c.data.cache_dir),
      field("data.image_size", c.data.image_size),
      field("data.mlm_probability", c.data.mlm_probability),
      field("data.mim_probability", c.data.mim_probability),
      field("data.itm_negative_probability", c.data.itm_negative_probability),
      field("data.lowercase", c.data.lowercase),
      field("data.image_mean", c.data.image_mean),
      field("data.image_std", c.data.image_std),
      field("data.max_image_pixels", c.data.max_image_pixels),
      field("data.workers", c.data.workers),
      field("data.queue_depth", c.data.queue_depth),
  };
}
std::vector<Field> parallel_fields(Config& c) {
  return {
      choice("parallel.layout", c.parallel.layout, {{"given", Layout::GIVEN}, {"auto", Layout::AUTO}}),
      choice("parallel.strategy", c.parallel.strategy, table_of(parallel::strategy_names(), parallel::strategy_named)),
      choice("parallel.mixed_precision", c.parallel.mixed_precision,
             table_of(parallel::precision_names(), parallel::precision_named)),
      choice("parallel.wrap", c.parallel.wrap,
             table_of(parallel::wrap_names(), parallel::wrap_named)),
      field("parallel.layer_classes", c.parallel.layer_classes),
      field("parallel.min_params", c.parallel.min_params),
      field("parallel.forward_prefetch", c.parallel.forward_prefetch),
      choice("parallel.backward_prefetch", c.parallel.backward_prefetch,
             {{"backward_pre", Prefetch::BACKWARD_PRE}, {"backward_post", Prefetch::BACKWARD_POST},
              {"none", Prefetch::NONE}}),
      field("parallel.limit_all_gathers", c.parallel.limit_all_gathers),
      field("parallel.activation_checkpointing", c.parallel.activation_checkpointing),
      field("parallel.activation_checkpointing_every", c.parallel.activation_checkpointing_every),
      cpu_offload_alias("parallel.cpu_offload", c.parallel.offload),
      choice("parallel.offload", c.parallel.offload, table_of(parallel::offload_names(), parallel::offload_named)),
      field("parallel.nvme_path", c.parallel.nvme_path),
      field("parallel.activation_offload", c.parallel.activation_offload),
      field("parallel.reshard_after_backward", c.parallel.reshard_after_backward),
      field("parallel.sync_module_states", c.parallel.sync_module_states),
      field("parallel.bucket_cap_mb", c.parallel.bucket_cap_mb),
      field("parallel.gradient_as_bucket_view", c.parallel.gradient_as_bucket_view),
      field("parallel.tp_size", c.parallel.tp_size),
      field("parallel.sequence_parallel", c.parallel.sequence_parallel),
      field("parallel.pp_size", c.parallel.pp_size),
      choice("parallel.pp_schedule", c.parallel.pp_schedule,
             table_of(parallel::pipeline_schedule_names(), parallel::pipeline_schedule_named)),
      field("parallel.pp_microbatches", c.parallel.pp_microbatches),
      field("parallel.pp_stages_per_rank", c.parallel.pp_stages_per_rank),
      field("parallel.pp_split_points", c.parallel.pp_split_points),
      field("parallel.dp_replicate_size", c.parallel.dp_replicate_size),
      field("parallel.dp_shard_size", c.parallel.dp_shard_size),
      field("parallel.timeout", c.parallel.timeout),
      field("parallel.check_replicas_every", c.parallel.check_replicas_every),
  };
}
std::vector<Field> optim_fields(Config& c) {
  return {
      choice("optim.name", c.optim.name, kOptimizers),
      field("optim.lr", c.optim.lr),
      field("optim.betas", c.optim.betas),
      field("optim.eps", c.optim.eps),
      field("optim.weight_decay", c.optim.weight_decay),
      field("optim.no_decay_1d", c.optim.no_decay_1d),
      field("optim.no_decay", c.optim.no_decay),
      choice("optim.schedule", c.optim.schedule,
             {{"cosine", LrSchedule::COSINE}, {"linear", LrSchedule::LINEAR}, {"constant", LrSchedule::CONSTANT}}),
      field("optim.warmup_steps", c.optim.warmup_steps),
      field("optim.min_lr_ratio", c.optim.min_lr_ratio),
      field("optim.fused", c.optim.fused),
      field("optim.use_kahan_summation", c.optim.use_kahan_summation),
      choice("optim.momentum_dtype", c.optim.momentum_dtype, dtype_names()),
      choice("optim.variance_dtype", c.optim.variance_dtype, dtype_names()),
      choice("optim.compensation_buffer_dtype", c.optim.compensation_buffer_dtype, dtype_names()),
      field("optim.momentum", c.optim.momentum),
      field("optim.nesterov", c.optim.nesterov),
      field("optim.relative_step", c.optim.relative_step),
      field("optim.scale_parameter", c.optim.scale_parameter),
      field("optim.warmup_init", c.optim.warmup_init),
      field("optim.clip_threshold", c.optim.clip_threshold),
      field("optim.decay_rate", c.optim.decay_rate),
      field("optim.beta1", c.optim.beta1),
      field("optim.adafactor_eps", c.optim.adafactor_eps),
  };
}
std::vector<Field> train_fields(Config& c) {
  return {
      field("train.steps", c.train.steps),
      // An integer, or "auto" (kAutoBatch).
      Field{"train.batch_size",
            [&c](auto& w, auto& p, auto& n) {
              if (n.IsScalar() && n.Scalar() == "auto") {
                c.train.batch_size = kAutoBatch;
                return;
              }
              c.train.batch_size = to_int(w, p, n);
              if (c.train.batch_size < 1) bad_value(w, p, n, "at least 1, or auto");
            },
            [&c] { return c.train.batch_size == kAutoBatch ? YAML::Node("auto") : YAML::Node(c.train.batch_size); }, {}},
      memory_size("train.memory_budget", c.train.memory_budget),
      memory_size("train.memory_limit", c.train.memory_limit),
      field("train.grad_accum", c.train.grad_accum),
      field("train.sync_each_batch", c.train.sync_each_batch),
      field("train.max_grad_norm", c.train.max_grad_norm),
      field("train.seed", c.train.seed),
      choice("train.device", c.train.device, table_of(parallel::device_names(), parallel::device_named)),
      field("train.task", c.train.task),
      field("train.tf32", c.train.tf32),
      choice("train.fp8", c.train.fp8,
             std::vector<std::pair<std::string, std::optional<parallel::Float8Recipe>>>{
                 {"none", std::nullopt},
                 {"tensorwise", parallel::Float8Recipe::TENSORWISE},
                 {"rowwise", parallel::Float8Recipe::ROWWISE}}),
      field("train.fp8_exclude", c.train.fp8_exclude),
      field("train.fp8_all_gather", c.train.fp8_all_gather),
      field("train.stop_at", c.train.stop_at),
      field("train.eval_interval", c.train.eval_interval),
      field("train.eval_samples", c.train.eval_samples),
      choice("train.on_nonfinite", c.train.on_nonfinite,
             {{"stop", NonFinite::STOP}, {"skip", NonFinite::SKIP}, {"rollback", NonFinite::ROLLBACK}}),
      field("train.max_skipped_steps", c.train.max_skipped_steps),
      field("train.skip_window", c.train.skip_window),
      field("train.max_rollbacks", c.train.max_rollbacks),
      field("train.force", c.train.force),
  };
}
std::vector<Field> checkpoint_fields(Config& c) {
  return {
      field("checkpoint.dir", c.checkpoint.dir),
      field("checkpoint.interval", c.checkpoint.interval),
      field("checkpoint.keep", c.checkpoint.keep),
      choice("checkpoint.resume", c.checkpoint.resume,
             {{"false", Resume::NEVER}, {"true", Resume::ALWAYS}, {"auto", Resume::AUTO}}),
      field("checkpoint.overwrite", c.checkpoint.overwrite),
      choice("checkpoint.state_dict_type", c.checkpoint.state_dict_type,
             {{"sharded", StateDictType::SHARDED}, {"full", StateDictType::FULL}}),
      field("checkpoint.allow_changes", c.checkpoint.allow_changes),
      field("checkpoint.async", c.checkpoint.async),
  };
}
std::vector<Field> log_fields(Config& c) {
  return {
      field("log.interval", c.log.interval),
      field("log.dir", c.log.dir),
      field("log.tensorboard", c.log.tensorboard),
      field("log.csv", c.log.csv),
      choice("log.progress", c.log.progress,
             {{"auto", Progress::AUTO}, {"bar", Progress::BAR}, {"lines", Progress::LINES}, {"none", Progress::NONE}}),
      field("log.peak_tflops", c.log.peak_tflops),
      field("log.warmup_steps", c.log.warmup_steps),
      choice("log.level", c.log.level,
             {{"debug", LogLevel::DEBUG}, {"info", LogLevel::INFO}, {"warning", LogLevel::WARNING},
              {"error", LogLevel::ERROR}}),
  };
}
std::vector<Field> launch_fields(Config& c) {
  return {
      field("launch.num_processes", c.launch.num_processes),
      field("launch.num_machines", c.launch.num_machines),
      field("launch.machine_rank", c.launch.machine_rank),
      field("launch.main_process_ip", c.launch.main_process_ip),
      field("launch.main_process_port", c.launch.main_process_port),
      field("launch.rdzv_id", c.launch.rdzv_id),
      field("launch.gpu_ids", c.launch.gpu_ids),
      field("launch.max_restarts", c.launch.max_restarts),
      field("launch.preempt_grace", c.launch.preempt_grace),
  };
}

}  // namespace

std::vector<Field> fields_of(Config& c) {
  std::vector<Field> out;
  for (auto* section : {model_fields, data_fields, parallel_fields, optim_fields, train_fields, checkpoint_fields,
                        log_fields, launch_fields}) {
    std::vector<Field> fields = section(c);
    out.insert(out.end(), std::make_move_iterator(fields.begin()), std::make_move_iterator(fields.end()));
  }
  return out;
}

void set_precision(Config& c, const std::string& where, const std::string& path, const YAML::Node& node) {
  choice(path, c.parallel.mixed_precision, table_of(parallel::precision_names(), parallel::precision_named))
      .set(where, path, node);
}
bool node_bool(const std::string& where, const std::string& path, const YAML::Node& node) {
  return to_bool(where, path, node);
}
int64_t node_int(const std::string& where, const std::string& path, const YAML::Node& node) {
  return to_int(where, path, node);
}
double node_double(const std::string& where, const std::string& path, const YAML::Node& node) {
  return to_double(where, path, node);
}
std::string node_string(const std::string& where, const std::string& path, const YAML::Node& node) {
  return to_str(where, path, node);
}
std::vector<std::string> node_list(const std::string& where, const std::string& path, const YAML::Node& node) {
  return to_strings(where, path, node, /*split_commas=*/true);
}
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates) {
  return util::closest_match(key, candidates);
}
void bad_value(const std::string& where, const std::string& path, const YAML::Node& value,
               const std::string& expected) {
  const std::string text = value.IsScalar() ? "'" + value.Scalar() + "'" : "a non-scalar value";
  throw ConfigError(where + ": " + path + ": " + text + " is not " + expected);
}

namespace {

// model.lora.from: the adapter's adapter_config.json (JSON, read as the YAML it also is) gives r, lora_alpha,
// lora_dropout, target_modules and modules_to_save. A LoRA shardtrain does not train as PEFT would (DoRA, rsLoRA,
// trained biases, per-module ranks, layers picked, targets as a regular expression) is refused by its key; an r or
// target_modules the config gives must be the adapter's. Read once (r set), a directory gone since — an export long
// after the run re-reads the run's config — keeps what was read.
void read_lora_adapter(models::LoraSpec& lora, const std::string& source) {
  if (lora.from.empty()) return;
  const std::string path = lora.from + "/adapter_config.json";
  if (!io::path_exists(path)) {
    if (lora.r > 0) return;
    throw ConfigError(source + ": model.lora.from: '" + lora.from + "' holds no adapter_config.json (expected the "
                      "directory PEFT's save_pretrained or `shardtrain checkpoint export --peft` writes)");
  }
  YAML::Node j;
  try {
    j = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": model.lora.from: " + path + " does not read as JSON: " + e.msg);
  }
  auto refuse = [&](const std::string& key, const std::string& value) {
    throw ConfigError(source + ": model.lora.from: " + path + " has " + key + ": " + value + ", a LoRA shardtrain " +
                      "does not train (it trains PEFT's plain LoRA: peft_type LORA, bias none, one r for all)");
  };
  const std::string where = "model.lora.from (" + path + ")";
  const std::string type = j["peft_type"] ? node_string(where, "peft_type", j["peft_type"]) : "";
  if (type != "LORA") refuse("peft_type", "'" + type + "'");
  // fan_in_fan_out (PEFT sets it for GPT-2's Conv1D) says how the base weights are stored, which the model knows:
  // the adapter's tensors and forward are the same either way.
  for (const char* flag : {"use_dora", "use_rslora"}) {
    if (j[flag] && !j[flag].IsNull() && node_bool(where, flag, j[flag])) refuse(flag, "true");
  }
  if (j["bias"] && !j["bias"].IsNull() && node_string(where, "bias", j["bias"]) != "none") {
    refuse("bias", "'" + j["bias"].as<std::string>() + "'");
  }
  for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
    if (j[pattern] && j[pattern].IsMap() && j[pattern].size() > 0) refuse(pattern, "a pattern");
  }
  if (j["layers_to_transform"] && !j["layers_to_transform"].IsNull()) refuse("layers_to_transform", "layers");
  const int64_t r = j["r"] ? node_int(where, "r", j["r"]) : 8;
  if (lora.r > 0 && lora.r != r) {
    throw ConfigError(source + ": model.lora.r is " + std::to_string(lora.r) + " but the adapter of model.lora.from (" +
                      path + ") has r " + std::to_string(r) + "; leave model.lora.r out");
  }
  std::vector<std::string> targets;
  if (j["target_modules"] && j["target_modules"].IsScalar()) {
    targets = {node_string(where, "target_modules", j["target_modules"])};
    if (targets[0] != "all-linear") refuse("target_modules", "'" + targets[0] + "' (a regular expression)");
  } else if (j["target_modules"] && !j["target_modules"].IsNull()) {
    targets = node_list(where, "target_modules", j["target_modules"]);
  }
  if (!lora.target_modules.empty() && lora.target_modules != targets) {
    throw ConfigError(source + ": model.lora.target_modules differ from those of the adapter of model.lora.from (" +
                      path + "); leave model.lora.target_modules out");
  }
  lora.r = r;
  lora.target_modules = targets;
  lora.lora_alpha = j["lora_alpha"] ? to_double(where, "lora_alpha", j["lora_alpha"]) : 8.0;
  lora.lora_dropout = j["lora_dropout"] ? to_double(where, "lora_dropout", j["lora_dropout"]) : 0.0;
  lora.modules_to_save = j["modules_to_save"] && !j["modules_to_save"].IsNull()
                             ? node_list(where, "modules_to_save", j["modules_to_save"])
                             : std::vector<std::string>{};
}

}  // namespace

models::LoraSpec read_peft_adapter(const std::string& dir, const std::string& source) {
  models::LoraSpec lora;
  lora.from = dir;
  read_lora_adapter(lora, source);
  return lora;
}

namespace {

class Reader {
 public:
  Reader(Config& config, std::string source) : config_(config), source_(std::move(source)), fields_(fields_of(config)) {
    for (const auto& f : fields_) paths_.push_back(f.path);
    all_paths_ = paths_;
    for (const auto& k : accelerate_key_paths()) all_paths_.push_back(k);
  }

  // A mapping at `prefix` ("" = the top level): each key is a field, a section holding fields, or Accelerate's.
  void read_map(const YAML::Node& map, const std::string& prefix) {
    if (!map.IsMap()) {
      throw ConfigError(where_of(source_, map) + ": " + (prefix.empty() ? "the config" : prefix) +
                        " must be a mapping of keys to values, not " + scalar_text(map));
    }
    for (const auto& item : map) {
      if (!item.first.IsScalar()) {  // YAML's complex keys ("? {a: b}"): a mapping or list where a name belongs
        throw ConfigError(where_of(source_, item.first) + ": a key of " + (prefix.empty() ? "the config" : prefix) +
                          " is " + scalar_text(item.first) + ", expected a name");
      }
      const std::string key = item.first.as<std::string>();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      set(path, item.second, where_of(source_, item.first));
    }
  }

  void set(const std::string& path, const YAML::Node& value, const std::string& where) {
    for (auto& f : fields_) {
      if (f.path == path) {
        f.set(where, path, value);
        return;
      }
    }
    if (path == "parallel" && value.IsScalar()) {  // `parallel: auto`, the layout's shorthand
      set("parallel.layout", value, where);
      return;
    }
    const std::string prefix = path + ".";
    for (const auto& p : all_paths_) {  // a section ("data", "data.mix", Accelerate's "fsdp_config")
      if (p.compare(0, prefix.size(), prefix) == 0) {
        read_map(value, path);
        return;
      }
    }
    if (apply_accelerate_key(config_, path, value, where)) return;
    throw ConfigError(where + ": unknown key '" + path + "'; did you mean '" + closest_key(path, all_paths_) +
                      "'? (`shardtrain config --default` prints every key)");
  }

  void apply_override(const std::string& text) {
    std::string body = text;
    if (body.rfind("--", 0) == 0) body = body.substr(2);
    const auto eq = body.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("override '" + text + "': expected --section.key=value");
    }
    const std::string path = body.substr(0, eq), value_text = body.substr(eq + 1);
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      throw ConfigError("override '" + text + "': the value is not valid YAML: " + e.msg);
    }
    set(path, value, "override --" + path);
  }

 private:
  Config& config_;
  std::string source_;
  std::vector<Field> fields_;
  std::vector<std::string> paths_;      // the tree's keys
  std::vector<std::string> all_paths_;  // and Accelerate's
};

}  // namespace

Config parse_config(const std::string& yaml, const std::string& source, const std::vector<std::string>& overrides) {
  Config config;
  Reader reader(config, source);
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (is_deepspeed_config(root)) {
    apply_deepspeed_config(config, root, source);  // a ds_config.json on its own: the rest from overrides
  } else if (!root.IsNull()) {
    reader.read_map(root, "");
  }
  for (const auto& o : overrides) reader.apply_override(o);
  if (!config.train.task.empty()) {  // train.task names model.task
    if (!config.model.task.empty() && config.model.task != config.train.task) {
      throw ConfigError("train.task: '" + config.train.task + "' with model.task: '" + config.model.task +
                        "' is not one task (train.task is another name for model.task; give one of them)");
    }
    config.model.task = config.train.task;
  }
  // Token classification reads transformers' run_ner's columns unless told: the words in `tokens`, their classes in
  // `ner_tags` (CoNLL-2003's).
  if (config.model.task == "token_classify") {
    if (config.data.text_fields == std::vector<std::string>{"text"}) config.data.text_fields = {"tokens"};
    if (config.data.label_field == "label") config.data.label_field = "ner_tags";
  }
  read_lora_adapter(config.model.lora, source);
  if (!config.model.from.empty()) {  // a Hugging Face directory: its config.json is the model, its files the weights
    try {  // a model name: its snapshot in the Hugging Face cache, as from_pretrained finds it offline
      config.model.from = io::resolve_hf_model(config.model.from, "model.from");
    } catch (const std::exception& e) {
      throw ConfigError(source + ": " + e.what());
    }
    config.model.flavor = config.model.from;
    if (config.model.init_weights.empty()) config.model.init_weights = config.model.from;
  }
  // Weights and a tokenizer named as a Hugging Face model ("org/name") that is no path here: its snapshot in the
  // cache, when the cache holds it (else the path's own error comes when it is opened).
  for (std::string* named : {&config.model.init_weights, &config.data.tokenizer}) {
    try {
      if (!named->empty() && !io::path_exists(*named)) *named = io::find_in_hf_cache(*named).value_or(*named);
    } catch (const std::exception& e) {
      throw ConfigError(source + ": " + e.what());
    }
  }
  validate(config);
  return config;
}

void apply_overrides(Config& config, const std::vector<std::string>& overrides) {
  Reader reader(config, "overrides");
  for (const auto& o : overrides) reader.apply_override(o);
}

pp::ScheduleShape pipeline_shape(const Config& c) {
  pp::ScheduleShape shape;
  shape.kind = c.parallel.pp_schedule;
  shape.ranks = static_cast<int>(c.parallel.pp_size);
  shape.stages_per_rank = static_cast<int>(c.parallel.pp_stages_per_rank);
  shape.microbatches = static_cast<int>(c.parallel.pp_microbatches > 0 ? c.parallel.pp_microbatches
                                                                       : c.parallel.pp_size);
  return shape;
}


Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read config file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

namespace {

void require(bool ok, const std::string& path, const std::string& value, const std::string& expected) {
  if (!ok) throw ConfigError(path + ": " + value + " is not " + expected);
}
std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
void require_probability(double p, const std::string& path) {
  require(p >= 0 && p <= 1, path, num(p), "a probability in [0, 1]");
}

}  // namespace

namespace {

// Each section's values against their ranges and each other (the keys and types are the field table's).
void validate_train(const Config& c) {
  require(c.train.steps >= 1, "train.steps", num(c.train.steps), "at least 1");
  require(c.train.batch_size >= 1 || c.train.batch_size == kAutoBatch, "train.batch_size", num(c.train.batch_size),
          "at least 1, or auto");
  require(c.train.grad_accum >= 1, "train.grad_accum", num(c.train.grad_accum), "at least 1");
  require(c.train.max_grad_norm >= 0, "train.max_grad_norm", num(c.train.max_grad_norm), "0 (off) or positive");
  require(c.train.stop_at >= 0 && c.train.stop_at <= c.train.steps, "train.stop_at", num(c.train.stop_at),
          "0 or a step up to train.steps (" + num(c.train.steps) + ")");
  require(c.train.eval_interval >= 0, "train.eval_interval", num(c.train.eval_interval), "0 or positive");
  require(c.train.eval_samples >= 0, "train.eval_samples", num(c.train.eval_samples), "0 or positive");
  require(c.train.max_skipped_steps >= 0, "train.max_skipped_steps", num(c.train.max_skipped_steps), "0 or positive");
  require(c.train.skip_window >= 1, "train.skip_window", num(c.train.skip_window), "at least 1 step");
  require(c.train.max_rollbacks >= 0, "train.max_rollbacks", num(c.train.max_rollbacks), "0 or positive");
  if (c.train.fp8 && c.parallel.mixed_precision == parallel::Precision::FP16) {
    throw ConfigError("train.fp8: " + parallel::to_string(*c.train.fp8) + " with parallel.mixed_precision: fp16 "
                      "is refused: the float8 products write their outputs in float16, which overflows at 65504, "
                      "and float16's loss scale multiplies the gradients they write; torchao trains float8 beside "
                      "bf16 or float32 (use mixed_precision: bf16)");
  }
  if (c.train.fp8_all_gather && c.train.fp8 != parallel::Float8Recipe::TENSORWISE) {
    throw ConfigError("train.fp8_all_gather: true needs train.fp8: tensorwise, and train.fp8 is " +
                      (c.train.fp8 ? parallel::to_string(*c.train.fp8) : std::string("none")) +
                      " (rowwise casts a weight per row forward and per column backward, so it gathers in bf16, as "
                      "torchao's does)");
  }
  const parallel::Strategy strategy = c.parallel.strategy;
  if (c.train.fp8_all_gather && (strategy == parallel::Strategy::DDP || strategy == parallel::Strategy::NO_SHARD)) {
    throw ConfigError("train.fp8_all_gather: true needs a strategy that shards the weights; parallel.strategy is " +
                      parallel::to_string(strategy) + ", which gathers nothing (use full_shard, shard_grad_op or "
                      "hybrid_shard)");
  }
}
void validate_allow_changes(const Config& c) {
  const std::vector<std::string> keys = key_paths();
  for (const std::string& key : c.checkpoint.allow_changes) {
    const bool section = std::any_of(keys.begin(), keys.end(), [&](const std::string& k) {
      return k.rfind(key + ".", 0) == 0;
    });
    require(key == "all" || section || std::find(keys.begin(), keys.end(), key) != keys.end(),
            "checkpoint.allow_changes", "'" + key + "'",
            "a key path, a section or all (closest key: " + closest_key(key, keys) + ")");
  }
}
void validate_model(const Config& c) {
  require(c.model.dtype != Dtype::FLOAT16, "model.dtype", "'float16'",
          "float32 or bfloat16 (pure float16 would need loss scaling with float16 weights; for float16 compute keep "
          "float32 weights with parallel.mixed_precision: fp16)");
  require(c.model.dtype == Dtype::FLOAT32 || c.parallel.mixed_precision == parallel::Precision::NO, "parallel.mixed_precision",
          "'" + parallel::to_string(c.parallel.mixed_precision) + "' with model.dtype: bfloat16",
          "no (the weights themselves compute in bfloat16)");
  require(c.model.lora.r >= 0, "model.lora.r", num(c.model.lora.r), "0 (no LoRA) or a rank of 1 or more");
  require(c.model.lora.lora_alpha > 0, "model.lora.lora_alpha", num(c.model.lora.lora_alpha), "positive");
  require(c.model.lora.lora_dropout >= 0 && c.model.lora.lora_dropout < 1, "model.lora.lora_dropout",
          num(c.model.lora.lora_dropout), "a probability in [0, 1)");
  require(c.model.lora.enabled() || (c.model.lora.target_modules.empty() && c.model.lora.modules_to_save.empty()),
          "model.lora.target_modules", "given with model.lora.r: 0",
          "a rank model.lora.r of 1 or more (r 0 is no LoRA)");
}
void validate_optim(const Config& c) {
  require(c.optim.lr > 0, "optim.lr", num(c.optim.lr), "positive");
  require(c.optim.betas.size() == 2, "optim.betas", std::to_string(c.optim.betas.size()) + " values",
          "two values [beta1, beta2]");
  for (double b : c.optim.betas) require(b >= 0 && b < 1, "optim.betas", num(b), "in [0, 1)");
  require(c.optim.eps > 0, "optim.eps", num(c.optim.eps), "positive");
  require(c.optim.momentum >= 0 && c.optim.momentum < 1, "optim.momentum", num(c.optim.momentum), "in [0, 1)");
  require(!c.optim.nesterov || c.optim.momentum > 0, "optim.nesterov", "true with momentum 0",
          "a positive optim.momentum (Nesterov's step is a momentum step)");
  require(c.optim.clip_threshold > 0, "optim.clip_threshold", num(c.optim.clip_threshold), "positive");
  require(c.optim.decay_rate < 0, "optim.decay_rate", num(c.optim.decay_rate),
          "negative (Adafactor's second-moment decay at step t is 1 - t^decay_rate)");
  require(c.optim.beta1 >= 0 && c.optim.beta1 < 1, "optim.beta1", num(c.optim.beta1), "in [0, 1) (0: no first moment)");
  require(c.optim.adafactor_eps.size() == 2, "optim.adafactor_eps",
          std::to_string(c.optim.adafactor_eps.size()) + " values", "two values [eps1, eps2]");
  for (double e : c.optim.adafactor_eps) require(e >= 0, "optim.adafactor_eps", num(e), "0 or positive");
  require(!c.optim.warmup_init || c.optim.relative_step, "optim.warmup_init", "true with optim.relative_step false",
          "optim.relative_step: true (warmup_init warms the relative step up)");
  require(c.optim.weight_decay >= 0, "optim.weight_decay", num(c.optim.weight_decay), "0 or positive");
  require(c.optim.warmup_steps >= 0, "optim.warmup_steps", num(c.optim.warmup_steps), "0 or positive");
  require(c.optim.min_lr_ratio >= 0 && c.optim.min_lr_ratio <= 1, "optim.min_lr_ratio", num(c.optim.min_lr_ratio),
          "in [0, 1]");
  for (const auto& pattern : c.optim.no_decay) {
    try {
      std::regex check(pattern);
    } catch (const std::regex_error& e) {
      throw ConfigError("optim.no_decay: '" + pattern + "' is not a regular expression (" + e.what() + ")");
    }
  }
}
void validate_data(const Config& c) {
  require_probability(c.data.mlm_probability, "data.mlm_probability");
  require_probability(c.data.mim_probability, "data.mim_probability");
  require_probability(c.data.itm_negative_probability, "data.itm_negative_probability");
  const MixConfig& m = c.data.mix;
  require(m.image_text >= 0 && m.text >= 0 && m.image >= 0 && m.image_text + m.text + m.image > 0, "data.mix",
          num(m.image_text) + "/" + num(m.text) + "/" + num(m.image), "non-negative weights with a positive sum");
  require(c.data.image_mean.size() == 3, "data.image_mean", std::to_string(c.data.image_mean.size()) + " values",
          "three values (R, G, B)");
  require(c.data.image_std.size() == 3, "data.image_std", std::to_string(c.data.image_std.size()) + " values",
          "three values (R, G, B)");
  for (double s : c.data.image_std) require(s > 0, "data.image_std", num(s), "positive");
  require(c.data.max_image_pixels >= 1, "data.max_image_pixels", num(c.data.max_image_pixels), "at least 1");
  require(c.data.max_text_length == 0 || c.data.max_text_length >= 3, "data.max_text_length",
          num(c.data.max_text_length), "0 (the model's) or at least 3");
  require(c.data.truncation == "warn" || c.data.truncation == "error", "data.truncation", "'" + c.data.truncation + "'",
          "warn (truncate and count) or error");
  require(c.data.padding == "max_length" || c.data.padding == "longest", "data.padding", "'" + c.data.padding + "'",
          "max_length (every text padded to data.max_text_length) or longest (to the batch's longest)");
  require(c.data.text_fields.size() == 1 || c.data.text_fields.size() == 2, "data.text_fields",
          std::to_string(c.data.text_fields.size()) + " fields", "one (a text) or two (a sentence pair)");
  for (size_t i = 0; i < c.data.labels.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      require(c.data.labels[i] != c.data.labels[j], "data.labels", "'" + c.data.labels[i] + "' twice",
              "distinct class names");
    }
  }
  require(c.data.image_size >= 0, "data.image_size", num(c.data.image_size), "0 (the model's) or positive");
  require(c.data.workers >= 0, "data.workers", num(c.data.workers), "0 (load on the training thread) or more");
  require(c.data.queue_depth >= 1, "data.queue_depth", num(c.data.queue_depth), "at least 1");
}
// The pipeline's sizes against each other and the batch: the schedule's own checks (pp/schedule.h), and a batch
// that splits into the microbatches.
void validate_pipeline(const Config& c) {
  const ParallelConfig& p = c.parallel;
  require(p.pp_size >= 1, "parallel.pp_size", num(p.pp_size), "1 (no pipeline) or more");
  require(p.pp_microbatches >= 0, "parallel.pp_microbatches", num(p.pp_microbatches), "0 (pp_size) or more");
  require(p.pp_stages_per_rank >= 1, "parallel.pp_stages_per_rank", num(p.pp_stages_per_rank), "1 or more");
  if (p.pp_size == 1 && p.pp_stages_per_rank == 1) {
    if (!p.pp_split_points.empty()) {
      throw ConfigError("parallel.pp_split_points: given without a pipeline (parallel.pp_size 1)");
    }
    return;
  }
  const int64_t stages = p.pp_size * p.pp_stages_per_rank;
  if (!p.pp_split_points.empty() && static_cast<int64_t>(p.pp_split_points.size()) != stages - 1) {
    throw ConfigError("parallel.pp_split_points: " + num(static_cast<int64_t>(p.pp_split_points.size())) +
                      " points for " + num(stages) + " stages (pp_size x pp_stages_per_rank): expected " +
                      num(stages - 1) + ", the first layer of each stage after the first");
  }
  try {
    pp::make_schedule(pipeline_shape(c));
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("parallel.pp_*: ") + e.what());
  }
  const int64_t m = pipeline_shape(c).microbatches, batch = c.train.batch_size;
  if (batch != kAutoBatch && batch % m != 0) {
    std::string divisors;
    for (int64_t d = 1; d <= batch; ++d) {
      if (batch % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    }
    throw ConfigError("train.batch_size " + num(batch) + " does not split into " + num(m) +
                      " pipeline microbatches (parallel.pp_microbatches): give a batch that is a multiple of " +
                      num(m) + ", or microbatches that divide " + num(batch) + " (" + divisors + ")");
  }
}


// parallel.layout: auto sets these keys itself: one the config gives another value than its default is refused.
void validate_auto_layout(const Config& c) {
  if (c.parallel.layout != Layout::AUTO) return;
  const ParallelConfig& p = c.parallel;
  const ParallelConfig d;
  std::string given;
  auto check = [&](bool differs, const char* key) {
    if (differs) given += (given.empty() ? "" : ", ") + std::string(key);
  };
  check(p.strategy != d.strategy, "parallel.strategy");
  check(p.wrap != d.wrap, "parallel.wrap");
  check(p.activation_checkpointing != d.activation_checkpointing, "parallel.activation_checkpointing");
  check(p.activation_checkpointing_every != d.activation_checkpointing_every,
        "parallel.activation_checkpointing_every");
  check(p.offload != d.offload, "parallel.offload");
  check(p.activation_offload != d.activation_offload, "parallel.activation_offload");
  check(p.tp_size != d.tp_size, "parallel.tp_size");
  check(p.sequence_parallel != d.sequence_parallel, "parallel.sequence_parallel");
  check(p.pp_size != d.pp_size, "parallel.pp_size");
  check(p.pp_schedule != d.pp_schedule, "parallel.pp_schedule");
  check(p.pp_microbatches != d.pp_microbatches, "parallel.pp_microbatches");
  check(p.pp_stages_per_rank != d.pp_stages_per_rank, "parallel.pp_stages_per_rank");
  check(p.pp_split_points != d.pp_split_points, "parallel.pp_split_points");
  check(p.dp_replicate_size != d.dp_replicate_size, "parallel.dp_replicate_size");
  check(p.dp_shard_size != d.dp_shard_size, "parallel.dp_shard_size");
  check(c.train.sync_each_batch, "train.sync_each_batch");
  if (!given.empty()) {
    throw ConfigError("parallel.layout: auto chooses " + given + ", which the config sets too: leave " +
                      (given.find(',') == std::string::npos ? "it" : "them") +
                      " out, or give the whole layout (parallel.layout: given)");
  }
}

void validate_parallel(const Config& c) {
  validate_auto_layout(c);
  if (c.parallel.offload != parallel::Offload::NONE && c.parallel.strategy == parallel::Strategy::DDP) {
    throw ConfigError("parallel.offload: " + parallel::to_string(c.parallel.offload) + " offloads the shards of an "
                      "FSDP strategy; ddp keeps the whole model on every device (use full_shard, or offload: none)");
  }
  if (c.parallel.offload == parallel::Offload::NVME && c.parallel.nvme_path.empty()) {
    throw ConfigError("parallel.offload: nvme needs parallel.nvme_path (an existing directory on a local disk, where "
                      "each rank keeps its optimizer state in a scratch file)");
  }
  if (c.parallel.offload == parallel::Offload::NVME && c.optim.name != OptimizerKind::ADAMW) {
    throw ConfigError("parallel.offload: nvme keeps AdamW's state on disk; optim.name is " +
                      to_string(c.optim.name) + " (use adamw, or offload: cpu)");
  }
  require(c.parallel.min_params >= 1, "parallel.min_params", num(c.parallel.min_params), "at least 1");
  require(c.parallel.bucket_cap_mb > 0, "parallel.bucket_cap_mb", num(c.parallel.bucket_cap_mb), "positive (MiB)");
  require(c.parallel.activation_checkpointing_every >= 1, "parallel.activation_checkpointing_every",
          std::to_string(c.parallel.activation_checkpointing_every), "1 or more (every k-th layer)");
  require(c.parallel.forward_prefetch >= 0, "parallel.forward_prefetch", num(c.parallel.forward_prefetch),
          "0 or more units");
  require(c.parallel.timeout >= 1, "parallel.timeout", num(c.parallel.timeout), "at least 1 (seconds)");
  require(c.parallel.check_replicas_every >= 0, "parallel.check_replicas_every",
          num(c.parallel.check_replicas_every), "0 (never) or a number of steps");
  require(c.parallel.tp_size >= 1, "parallel.tp_size", num(c.parallel.tp_size), "1 (no tensor parallelism) or more");
  require(c.parallel.dp_replicate_size >= 0, "parallel.dp_replicate_size", num(c.parallel.dp_replicate_size),
          "0 (inferred) or more");
  require(c.parallel.dp_shard_size >= 0, "parallel.dp_shard_size", num(c.parallel.dp_shard_size),
          "0 (inferred) or more");
  require(!c.parallel.sequence_parallel || c.parallel.tp_size > 1, "parallel.sequence_parallel", "true",
          "possible with parallel.tp_size 1 (it shards the activations between tensor-parallel regions)");
  validate_pipeline(c);
  require(c.parallel.dp_replicate_size <= 1 || parallel::is_hybrid(c.parallel.strategy) ||
              c.parallel.strategy == parallel::Strategy::DDP || c.parallel.strategy == parallel::Strategy::NO_SHARD,
          "parallel.dp_replicate_size", num(c.parallel.dp_replicate_size),
          "possible under " + parallel::to_string(c.parallel.strategy) +
              ", which shards over every data-parallel rank (hybrid_shard replicates across dp_replicate_size groups)");
}
void validate_checkpoint(const Config& c) {
  require(c.checkpoint.interval >= 0, "checkpoint.interval", num(c.checkpoint.interval), "0 or positive");
  require(c.checkpoint.keep >= 0, "checkpoint.keep", num(c.checkpoint.keep), "0 (keep all) or positive");
  require(c.checkpoint.resume == Resume::NEVER || !c.checkpoint.dir.empty(), "checkpoint.resume",
          c.checkpoint.resume == Resume::AUTO ? "auto" : "true",
          "possible without checkpoint.dir (where would it resume from?)");
}
void validate_log(const Config& c) {
  require(c.log.interval >= 1, "log.interval", num(c.log.interval), "at least 1");
  require(c.log.peak_tflops >= 0, "log.peak_tflops", num(c.log.peak_tflops), "0 (measure) or positive");
  require(c.log.warmup_steps >= 0, "log.warmup_steps", num(c.log.warmup_steps), "0 or positive");
}
void validate_launch(const Config& c) {
  require(c.launch.num_processes >= 1, "launch.num_processes", num(c.launch.num_processes), "at least 1");
  require(c.launch.num_machines >= 1, "launch.num_machines", num(c.launch.num_machines), "at least 1");
  require(c.launch.num_processes % c.launch.num_machines == 0, "launch.num_processes",
          num(c.launch.num_processes), "a multiple of launch.num_machines (" + num(c.launch.num_machines) + ")");
  require(c.launch.machine_rank >= 0 && c.launch.machine_rank < c.launch.num_machines, "launch.machine_rank",
          num(c.launch.machine_rank), "in [0, launch.num_machines)");
  require(c.launch.main_process_port >= 0 && c.launch.main_process_port < 65536, "launch.main_process_port",
          num(c.launch.main_process_port), "a port number");
  require(c.launch.max_restarts >= 0, "launch.max_restarts", num(c.launch.max_restarts), "0 or more");
  require(c.launch.preempt_grace >= 0, "launch.preempt_grace", num(c.launch.preempt_grace), "0 or more seconds");
  try {
    launch::gpu_ids_checked("launch.gpu_ids", c.launch.gpu_ids);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
}

}  // namespace

void validate(const Config& c) {
  validate_train(c);
  validate_allow_changes(c);
  validate_model(c);
  validate_optim(c);
  validate_data(c);
  validate_parallel(c);
  validate_checkpoint(c);
  validate_log(c);
  validate_launch(c);
}

std::string to_yaml(const Config& config, bool annotated) {
  Config copy = config;
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the sections open around the last key: {"model", "lora"}
  for (const auto& f : fields_of(copy)) {
    const std::vector<std::string> parts = path_parts(f.path);
    const std::vector<std::string> sections(parts.begin(), parts.end() - 1);
    size_t shared = 0;
    while (shared < open.size() && shared < sections.size() && open[shared] == sections[shared]) ++shared;
    for (size_t i = open.size(); i > shared; --i) out << YAML::EndMap;
    for (size_t i = shared; i < sections.size(); ++i) out << YAML::Key << sections[i] << YAML::Value << YAML::BeginMap;
    open = sections;
    out << YAML::Key << parts.back() << YAML::Value << f.get();
    if (annotated && !f.choices.empty()) {
      std::string all;
      for (const std::string& c : f.choices) all += (all.empty() ? "" : " | ") + c;
      out << YAML::Comment(all);
    }
  }
  for (size_t i = 0; i < open.size(); ++i) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<std::string> key_paths() {
  Config c;
  std::vector<std::string> out;
  for (const auto& f : fields_of(c)) out.push_back(f.path);
  return out;
}

std::string to_string(OptimizerKind k) {
  for (const auto& [name, value] : kOptimizers) {
    if (value == k) return name;
  }
  return "?";
}

namespace {

// A YAML value as one line of text, the same for equal values however they were written (block or flow, 0.9 or
// 0.90000000000000002): numbers in the shortest form that reads back to the same double, lists as [a, b], maps as
// {key: value} in key order.
std::string canonical_text(const YAML::Node& node) {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    try {
      size_t used = 0;
      const double v = std::stod(s, &used);
      if (used == s.size() && std::isfinite(v)) {
        char text[40];
        for (int digits : {15, 16, 17}) {
          std::snprintf(text, sizeof(text), "%.*g", digits, v);
          if (std::stod(text) == v) break;
        }
        return text;
      }
    } catch (const std::exception&) {
    }
    return s;
  }
  if (node.IsSequence()) {
    std::string out = "[";
    for (size_t i = 0; i < node.size(); ++i) out += (i ? ", " : "") + canonical_text(node[i]);
    return out + "]";
  }
  if (node.IsMap()) {
    std::map<std::string, std::string> items;
    for (const auto& item : node) items[item.first.as<std::string>()] = canonical_text(item.second);
    std::string out = "{";
    for (const auto& [k, v] : items) out += (out.size() > 1 ? ", " : "") + k + ": " + v;
    return out + "}";
  }
  return "";
}

// The node at parts[i..] below `node` (["train", "steps"]); nullopt when one is missing. Handles are only
// constructed, never assigned: yaml-cpp's assignment rebinds the node it refers to.
std::optional<YAML::Node> node_at(const YAML::Node& node, const std::vector<std::string>& parts, size_t i = 0) {
  if (i == parts.size()) return node;
  if (!node.IsMap()) return std::nullopt;
  const YAML::Node child = node[parts[i]];
  if (!child) return std::nullopt;
  return node_at(child, parts, i + 1);
}

}  // namespace

std::vector<KeyChange> changed_keys(const std::string& before_yaml, const Config& after) {
  YAML::Node before;
  try {
    before = YAML::Load(before_yaml);
  } catch (const YAML::Exception& e) {
    throw ConfigError("the earlier config does not read as YAML: " + e.msg);
  }
  Config now = after, defaults;
  const std::vector<Field> now_fields = fields_of(now), default_fields = fields_of(defaults);
  std::vector<KeyChange> out;
  for (size_t i = 0; i < now_fields.size(); ++i) {
    const std::string value = canonical_text(now_fields[i].get());
    const std::optional<YAML::Node> old = node_at(before, path_parts(now_fields[i].path));
    const std::string old_value = canonical_text(old ? *old : default_fields[i].get());
    if (old_value != value) out.push_back({now_fields[i].path, old ? old_value : "(absent)", value});
  }
  return out;
}

}  // namespace shardtrain::config
