// The config tree as a list of fields (private to the config layer): each key path with how to read its value
// from YAML and how to write it back. config.cpp owns the list; accelerate_keys.cpp maps Accelerate's keys onto it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <vector>

#include "shardtrain/config/config.h"
#include "shardtrain/util/ascii_case.h"

namespace shardtrain::config {

struct Field {
  std::string path;  // "train.steps"
  // Reads `node` into the field, or throws ConfigError naming `where`, `path` and what was expected.
  std::function<void(const std::string& where, const std::string& path, const YAML::Node& node)> set;
  std::function<YAML::Node()> get;
  std::vector<std::string> choices;  // an enumeration's values, in YAML's spelling; empty for other fields
};

// Fields bound to `c` (the references stay valid while `c` lives).
std::vector<Field> fields_of(Config& c);

// Value readers shared with accelerate_keys.cpp (same error messages).
void set_precision(Config& c, const std::string& where, const std::string& path, const YAML::Node& node);
bool node_bool(const std::string& where, const std::string& path, const YAML::Node& node);
int64_t node_int(const std::string& where, const std::string& path, const YAML::Node& node);
double node_double(const std::string& where, const std::string& path, const YAML::Node& node);
std::string node_string(const std::string& where, const std::string& path, const YAML::Node& node);
std::vector<std::string> node_list(const std::string& where, const std::string& path, const YAML::Node& node);
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates);
// A bad value of Accelerate's or DeepSpeed's keys (matched upper-cased: util::ascii_upper): a ConfigError naming
// `where`, `path`, the value and what was expected.
[[noreturn]] void bad_value(const std::string& where, const std::string& path, const YAML::Node& value,
                            const std::string& expected);

// A key of Accelerate's or DeepSpeed's that sets one member of the config, its value read by `read` (node_bool,
// node_int, node_double, node_string, node_list).
#define SHARDTRAIN_CONFIG_KEY(fn, member, read)                                                \
  void fn(Config& c, const std::string& where, const std::string& path, const YAML::Node& v) { \
    c.member = read(where, path, v);                                                           \
  }

// Accelerate config keys ("mixed_precision", "fsdp_config.fsdp_sharding_strategy", ...): applies `path` when it is
// one of them and returns true; false when it is not. A bad value throws ConfigError.
bool apply_accelerate_key(Config& c, const std::string& path, const YAML::Node& value, const std::string& where);
// Every Accelerate key path that apply_accelerate_key knows (for "did you mean").
std::vector<std::string> accelerate_key_paths();

// DeepSpeed's values shared with Accelerate's deepspeed_config block (deepspeed_keys.cpp): a ZeRO stage as the
// strategy, an offload device (none, cpu, nvme) as parallel.offload, an NVMe path.
void zero_stage(Config& c, const std::string& where, const std::string& path, const YAML::Node& value);
void offload_device(Config& c, const std::string& where, const std::string& path, const YAML::Node& value);
void nvme_path(Config& c, const std::string& where, const std::string& path, const YAML::Node& value);
// Whether a document is a DeepSpeed config (ds_config.json): its top level has zero_optimization,
// train_micro_batch_size_per_gpu or train_batch_size, none of which shardtrain's own tree has.
bool is_deepspeed_config(const YAML::Node& root);
// Applies a DeepSpeed config's keys (`where`: its file, for errors); keys without effect go to c.unused_keys with
// the reason, a key with no counterpart throws ConfigError naming it.
void apply_deepspeed_config(Config& c, const YAML::Node& root, const std::string& where);
void apply_deepspeed_config_file(Config& c, const std::string& path, const std::string& where);

}  // namespace shardtrain::config
