// The vocabulary of a data-parallel run, one type per concept, shared by the runtime (distributed/, fsdp/, ddp/),
// the config, the planner and the command line: how the model's state is split over the ranks, where and in what
// precision it computes.
// Names are the config's spelling ("full_shard", "bf16"), which Accelerate's and PyTorch's upper-case ones map onto
// (config/accelerate_keys.cpp).
#pragma once

#include <string>
#include <vector>

namespace shardtrain::parallel {

// PyTorch FSDP's sharding strategies (fsdp::strategy_groups expresses each over a mesh), and DDP (ddp::replicate):
//   FULL_SHARD          parameters, gradients and optimizer state sharded over the world (ZeRO-3)
//   SHARD_GRAD_OP       gradients and optimizer state sharded, parameters kept gathered through backward (ZeRO-2)
//   NO_SHARD            everything whole on every rank, gradients all-reduced, through FSDP's machinery
//   HYBRID_SHARD        FULL_SHARD within a node, replicated across nodes
//   HYBRID_SHARD_ZERO2  SHARD_GRAD_OP within a node, replicated across nodes
//   DDP                 the whole model on every rank, bucketed all-reduce of gradients during backward
enum class Strategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, DDP };

// Where a rank computes: the CPU (its collectives over Gloo), or its node's GPU (NCCL, or Gloo through host copies).
// AUTO, a run's default, asks for CUDA when the machine has a visible GPU and the CPU otherwise; a run resolves it
// at its start (cuda::resolve_device), so nothing that computes sees it.
enum class Device { AUTO, CPU, CUDA };

// Mixed precision: the dtype gathered parameters and activations compute in (float32 masters kept): none, bfloat16,
// or float16 with loss scaling.
enum class Precision { NO, BF16, FP16 };

// FSDP's units (Accelerate's fsdp_auto_wrap_policy): each transformer layer and the root, units closed at a
// parameter count, or the whole model as one unit.
enum class Wrap { TRANSFORMER, SIZE, NONE };

// Where an FSDP strategy keeps the model's state (DeepSpeed's offload devices): on the device; CPU offload (the
// shards, their gradients and the optimizer's state in host memory); or that with the optimizer's state on a local
// disk (ZeRO-Infinity's NVMe tier, optim/disk_adamw.h).
enum class Offload { NONE, CPU, NVME };

// Pipeline parallelism's schedules (pp/schedule.h): all forwards then all backwards (GPipe); one forward one
// backward after a warm-up (1F1B); 1F1B over several stages per rank (interleaved, Megatron's virtual stages); and
// 1F1B with each backward split into its input gradient and its weight gradient, the latter deferred into the
// bubble (zero bubble, ZB-H1).
enum class PipelineSchedule { GPIPE, ONE_F_ONE_B, INTERLEAVED_1F1B, ZERO_BUBBLE };

// Float8 training's recipes (torchao's; nn/float8_linear.h): one dynamic scale per tensor, e5m2 gradients
// (tensorwise), or a power-of-2 scale per row, e4m3 throughout (rowwise).
enum class Float8Recipe { TENSORWISE, ROWWISE };

std::string to_string(Strategy s);  // "full_shard", ..., "ddp"
std::string to_string(PipelineSchedule s);  // "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"
std::string to_string(Precision p);  // "no", "bf16", "fp16"
std::string to_string(Device d);     // "auto", "cpu", "cuda"
std::string to_string(Wrap w);       // "transformer", "size", "none"
std::string to_string(Offload o);    // "none", "cpu", "nvme"
std::string to_string(Float8Recipe r);  // "tensorwise", "rowwise"
// The value a name spells; std::invalid_argument naming it and every name otherwise.
Strategy strategy_named(const std::string& name);
Precision precision_named(const std::string& name);
Device device_named(const std::string& name);
Wrap wrap_named(const std::string& name);
Offload offload_named(const std::string& name);
PipelineSchedule pipeline_schedule_named(const std::string& name);
Float8Recipe float8_recipe_named(const std::string& name);
std::vector<std::string> strategy_names();
std::vector<std::string> precision_names();
std::vector<std::string> device_names();
std::vector<std::string> wrap_names();
std::vector<std::string> offload_names();
std::vector<std::string> pipeline_schedule_names();
std::vector<std::string> float8_recipe_names();

// Sharded within a node and replicated across nodes.
bool is_hybrid(Strategy s);
// One of FSDP's (all but DDP).
bool is_fsdp(Strategy s);

}  // namespace shardtrain::parallel
