// The keys of an Accelerate config file (`accelerate config`'s output), mapped onto shardtrain's tree so that a
// user's existing file works as it is. Values take Accelerate's spellings (FULL_SHARD or 1, TRANSFORMER_BASED_WRAP,
// BACKWARD_PRE, SHARDED_STATE_DICT, ...). Keys that only matter to Accelerate's own launcher are accepted and
// ignored (kIgnored); anything else Accelerate has that shardtrain cannot do is an error that says so.
#include <map>

#include "config/fields.h"

#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::config {
namespace {

using Setter = void (*)(Config&, const std::string& where, const std::string& path, const YAML::Node& value);

void sharding_strategy(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  // Accelerate writes the name or FSDP's enum number (1 = FULL_SHARD ... 5 = HYBRID_SHARD_ZERO2).
  static const std::map<std::string, parallel::Strategy> names = {
      {"FULL_SHARD", parallel::Strategy::FULL_SHARD},     {"1", parallel::Strategy::FULL_SHARD},
      {"SHARD_GRAD_OP", parallel::Strategy::SHARD_GRAD_OP}, {"2", parallel::Strategy::SHARD_GRAD_OP},
      {"NO_SHARD", parallel::Strategy::NO_SHARD},         {"3", parallel::Strategy::NO_SHARD},
      {"HYBRID_SHARD", parallel::Strategy::HYBRID_SHARD}, {"4", parallel::Strategy::HYBRID_SHARD},
      {"HYBRID_SHARD_ZERO2", parallel::Strategy::HYBRID_SHARD_ZERO2}, {"5", parallel::Strategy::HYBRID_SHARD_ZERO2}};
  auto it = value.IsScalar() ? names.find(util::ascii_upper(value.Scalar())) : names.end();
  if (it == names.end()) {
    bad_value(where, path, value,
              "one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 (or 1-5)");
  }
  c.parallel.strategy = it->second;
}

void auto_wrap_policy(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  const std::string v = value.IsScalar() ? util::ascii_upper(value.Scalar()) : "";
  if (v == "TRANSFORMER_BASED_WRAP") c.parallel.wrap = parallel::Wrap::TRANSFORMER;
  else if (v == "SIZE_BASED_WRAP") c.parallel.wrap = parallel::Wrap::SIZE;
  else if (v == "NO_WRAP") c.parallel.wrap = parallel::Wrap::NONE;
  else bad_value(where, path, value, "one of TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP");
}

void backward_prefetch(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  const std::string v = value.IsScalar() ? util::ascii_upper(value.Scalar()) : "";
  if (v == "BACKWARD_PRE") c.parallel.backward_prefetch = Prefetch::BACKWARD_PRE;
  else if (v == "BACKWARD_POST") c.parallel.backward_prefetch = Prefetch::BACKWARD_POST;
  else if (v == "NO_PREFETCH" || v == "NONE" || v == "NULL" || v == "~") c.parallel.backward_prefetch = Prefetch::NONE;
  else bad_value(where, path, value, "one of BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH");
}

void state_dict_type(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  const std::string v = value.IsScalar() ? util::ascii_upper(value.Scalar()) : "";
  // LOCAL_STATE_DICT (FSDP1's flat shards) is per-rank too: the sharded form is its equivalent here.
  if (v == "SHARDED_STATE_DICT" || v == "LOCAL_STATE_DICT") c.checkpoint.state_dict_type = StateDictType::SHARDED;
  else if (v == "FULL_STATE_DICT") c.checkpoint.state_dict_type = StateDictType::FULL;
  else bad_value(where, path, value, "one of FULL_STATE_DICT, SHARDED_STATE_DICT, LOCAL_STATE_DICT");
}

void reshard_after_forward(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  // FSDP2 in Accelerate: a bool; FSDP1 in newer Accelerate: a sharding strategy name.
  if (value.IsScalar()) {
    const std::string v = util::ascii_upper(value.Scalar());
    if (v == "TRUE" || v == "FALSE") {
      const bool reshard = v == "TRUE";
      c.parallel.strategy = reshard ? parallel::Strategy::FULL_SHARD : parallel::Strategy::SHARD_GRAD_OP;
      return;
    }
  }
  sharding_strategy(c, where, path, value);
}

void distributed_type(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  const std::string v = value.IsScalar() ? util::ascii_upper(value.Scalar()) : "";
  // FSDP: the strategy comes from fsdp_config; DEEPSPEED: from deepspeed_config's ZeRO stage (full sharding unless
  // it says otherwise); NO: one process.
  if (v == "FSDP" || v == "DEEPSPEED" || v == "NO") return;
  if (v == "MULTI_GPU" || v == "MULTI_CPU") {  // DDP on the devices named (use_cpu: true still means the CPU)
    c.parallel.strategy = parallel::Strategy::DDP;
    if (c.train.device == parallel::Device::AUTO) {
      c.train.device = v == "MULTI_GPU" ? parallel::Device::CUDA : parallel::Device::CPU;
    }
    return;
  }
  bad_value(where, path, value, "a distributed type shardtrain runs (FSDP, DEEPSPEED, MULTI_GPU, MULTI_CPU or NO)");
}

void use_cpu(Config& c, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (node_bool(where, path, value)) c.train.device = parallel::Device::CPU;
}

void fsdp_version(Config&, const std::string& where, const std::string& path, const YAML::Node& value) {
  const int64_t v = node_int(where, path, value);
  if (v != 1 && v != 2) bad_value(where, path, value, "1 or 2");  // both mean fully_shard here (FSDP2's semantics)
}

void accepted(Config&, const std::string&, const std::string&, const YAML::Node&) {}

// Context parallelism (attention split over the sequence) is not one of shardtrain's dimensions.
void cp_size(Config&, const std::string& where, const std::string& path, const YAML::Node& value) {
  if (node_int(where, path, value) != 1) bad_value(where, path, value, "1 (context parallelism is not supported)");
}

SHARDTRAIN_CONFIG_KEY(sync_module_states, parallel.sync_module_states, node_bool)
SHARDTRAIN_CONFIG_KEY(activation_checkpointing, parallel.activation_checkpointing, node_bool)
SHARDTRAIN_CONFIG_KEY(limit_all_gathers, parallel.limit_all_gathers, node_bool)
SHARDTRAIN_CONFIG_KEY(set_num_processes, launch.num_processes, node_int)
SHARDTRAIN_CONFIG_KEY(set_num_machines, launch.num_machines, node_int)
SHARDTRAIN_CONFIG_KEY(set_machine_rank, launch.machine_rank, node_int)
SHARDTRAIN_CONFIG_KEY(set_main_process_ip, launch.main_process_ip, node_string)
SHARDTRAIN_CONFIG_KEY(set_main_process_port, launch.main_process_port, node_int)
SHARDTRAIN_CONFIG_KEY(set_fsdp_transformer_layer_cls_to_wrap, parallel.layer_classes, node_list)
SHARDTRAIN_CONFIG_KEY(set_fsdp_min_num_params, parallel.min_params, node_int)
SHARDTRAIN_CONFIG_KEY(set_gpu_ids, launch.gpu_ids, node_string)
SHARDTRAIN_CONFIG_KEY(set_gradient_accumulation_steps, train.grad_accum, node_int)
SHARDTRAIN_CONFIG_KEY(set_tp_size, parallel.tp_size, node_int)
SHARDTRAIN_CONFIG_KEY(set_dp_shard_size, parallel.dp_shard_size, node_int)
SHARDTRAIN_CONFIG_KEY(set_dp_replicate_size, parallel.dp_replicate_size, node_int)
SHARDTRAIN_CONFIG_KEY(gradient_clipping, train.max_grad_norm, node_double)

const std::map<std::string, Setter>& keys() {
  static const std::map<std::string, Setter> table = {
      {"distributed_type", distributed_type},
      {"mixed_precision", set_precision},
      {"use_cpu", use_cpu},
      {"num_processes", set_num_processes},
      {"num_machines", set_num_machines},
      {"machine_rank", set_machine_rank},
      {"main_process_ip", set_main_process_ip},
      {"main_process_port", set_main_process_port},
      {"gpu_ids", set_gpu_ids},
      {"gradient_accumulation_steps", set_gradient_accumulation_steps},
      {"fsdp_config.fsdp_sharding_strategy", sharding_strategy},
      {"fsdp_config.fsdp_auto_wrap_policy", auto_wrap_policy},
      {"fsdp_config.fsdp_transformer_layer_cls_to_wrap", set_fsdp_transformer_layer_cls_to_wrap},
      {"fsdp_config.fsdp_min_num_params", set_fsdp_min_num_params},
      {"fsdp_config.fsdp_backward_prefetch", backward_prefetch},
      {"fsdp_config.fsdp_backward_prefetch_policy", backward_prefetch},  // older Accelerate's name
      {"fsdp_config.fsdp_forward_prefetch",
       [](Config& c, const std::string& w, const std::string& p, const YAML::Node& v) {
         c.parallel.forward_prefetch = node_bool(w, p, v) ? 1 : 0;
       }},
      {"fsdp_config.fsdp_offload_params",
       [](Config& c, const std::string& w, const std::string& p, const YAML::Node& v) {
         c.parallel.offload = node_bool(w, p, v) ? parallel::Offload::CPU : parallel::Offload::NONE;
       }},
      {"fsdp_config.fsdp_state_dict_type", state_dict_type},
      {"fsdp_config.fsdp_sync_module_states", sync_module_states},
      {"fsdp_config.fsdp_activation_checkpointing", activation_checkpointing},
      {"fsdp_config.fsdp_limit_all_gathers", limit_all_gathers},
      {"fsdp_config.fsdp_reshard_after_forward", reshard_after_forward},
      {"fsdp_config.fsdp_version", fsdp_version},
      // Always true here: the module keeps its own parameter tensors (FSDP2), so use_orig_params has nothing to
      // switch; cpu_ram_efficient_loading is what build_parallel does anyway (each layer sharded as it is built).
      // Accelerate's ParallelismConfig: the mesh's sizes.
      {"parallelism_config.parallelism_config_tp_size", set_tp_size},
      {"parallelism_config.parallelism_config_dp_shard_size", set_dp_shard_size},
      {"parallelism_config.parallelism_config_dp_replicate_size", set_dp_replicate_size},
      {"parallelism_config.parallelism_config_cp_size", cp_size},
      {"parallelism_config.parallelism_config_cp_comm_strategy", accepted},
      // DeepSpeed's (distributed_type: DEEPSPEED): ZeRO's stage as the strategy, its offload devices and NVMe path
      // as parallel.offload and nvme_path.
      {"deepspeed_config.zero_stage", zero_stage},
      {"deepspeed_config.offload_optimizer_device", offload_device},
      {"deepspeed_config.offload_param_device", offload_device},
      {"deepspeed_config.offload_optimizer_nvme_path", nvme_path},
      {"deepspeed_config.offload_param_nvme_path", nvme_path},
      {"deepspeed_config.deepspeed_config_file",  // a ds_config.json, relative to where the job starts
       [](Config& c, const std::string& w, const std::string& p, const YAML::Node& v) {
         apply_deepspeed_config_file(c, node_string(w, p, v), w + ": " + p);
       }},
      {"deepspeed_config.gradient_accumulation_steps", set_gradient_accumulation_steps},
      {"deepspeed_config.gradient_clipping", gradient_clipping},
      {"deepspeed_config.zero3_init_flag", accepted},        // each layer is sharded as it is built anyway
      {"deepspeed_config.zero3_save_16bit_model", accepted},  // checkpoint.state_dict_type says what is saved
      {"deepspeed_config.deepspeed_multinode_launcher", accepted},
      {"fsdp_config.fsdp_use_orig_params", accepted},
      {"fsdp_config.fsdp_cpu_ram_efficient_loading", accepted},
      // Accelerate launcher details with no effect on a shardtrain run.
      {"compute_environment", accepted},
      {"main_training_function", accepted},
      {"downcast_bf16", accepted},
      {"rdzv_backend", accepted},
      {"same_network", accepted},
      // torch.compile's settings: LibTorch has no compiler to hand them to, and the run is the same without.
      {"dynamo_config",
       [](Config& c, const std::string& w, const std::string& p, const YAML::Node&) {
         c.unused_keys.push_back(w + ": " + p + ": no effect here (torch.compile's settings; LibTorch has no "
                                 "compiler to hand them to)");
       }},
      {"tpu_env", accepted},
      {"tpu_use_cluster", accepted},
      {"tpu_use_sudo", accepted},
      {"debug", accepted},
      {"enable_cpu_affinity", accepted},
  };
  return table;
}

}  // namespace

bool apply_accelerate_key(Config& c, const std::string& path, const YAML::Node& value, const std::string& where) {
  auto it = keys().find(path);
  if (it == keys().end()) return false;
  it->second(c, where, path, value);
  return true;
}

std::vector<std::string> accelerate_key_paths() {
  std::vector<std::string> out;
  for (const auto& item : keys()) out.push_back(item.first);
  return out;
}

}  // namespace shardtrain::config
