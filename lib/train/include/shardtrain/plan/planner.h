// `shardtrain plan`: every data-, tensor- and pipeline-parallel configuration of a model that fits a cluster, each with its
// largest local batch (the memory model, plan/memory_model.h) and its predicted throughput, best first.
//
//   plan::Cluster cluster;                       // 8 x A100-40GB by default
//   auto configs = plan::plan_configurations(*models::recipe_of("flava-2.7b"), cluster);
//   configs.front().job                          // the recommended one; plan::trainer_yaml(...) writes it
//
// Throughput is a stated model, each constant a field of Cluster:
//   compute   = training FLOPs of the step (the recipe's formula; with activation checkpointing of every k-th
//               layer x (1 + 1 / 3k): their forward once more) / (peak_tflops x efficiency x n / (n +
//               half_efficiency_tokens) x w / (w + half_efficiency_width)), n the tokens (text and image patches)
//               per GPU per micro-batch, w the layers' width (a layer of width w holds about 12 w^2 parameters: the
//               rank's share under tensor parallelism): short batches and narrow matrices keep the GPU's cores
//               from filling, and the elementwise work (norms, activations, softmax: ~w per token against
//               matrices' ~w^2) weighs more in narrow layers; both saturate. `efficiency` is the GPU's (its preset,
//               fitted to published runs: published_runs()); with gradient accumulation each micro-batch computed
//               and gathered, the gradients reduced once
//   traffic   = bytes each rank sends per step: FULL_SHARD all-gathers the parameters twice (forward, backward) and
//               reduce-scatters the gradients (of the trainable parameters: a LoRA recipe's adapters alone),
//               SHARD_GRAD_OP gathers once, DDP and NO_SHARD all-reduce (2x),
//               hybrid strategies do that within a node and all-reduce their shards across nodes; x (W-1)/W;
//               CPU offload adds the shards' round trip over PCIe, activation offload what the layers keep
//               (there in forward, back in backward)
//   comm      = traffic / bandwidth (intra- or inter-node);  exposed = comm x (1 - overlap), or all of it when the
//               whole model is one unit (nothing to overlap with), and never less than comm - compute
//   tensor    with tp > 1 (within a node, sequence parallel where the family's plan can be): compute / tp, at
//               the width of the rank's slices; the
//               traffic above over world / tp data-parallel ranks of a rank's slices; and each layer's input
//               (B, T, C) all-reduced 4 times a step (6 with checkpointing) over the tp ranks, 2 (tp - 1) / tp of
//               it, on the intra-node bandwidth and never hidden
//   pipeline  with pp > 1 (the trainer's: FSDP over each stage's ranks, 1F1B over 4 x pp microbatches): compute x the
//               busiest rank's share of the layers' parameters (the head with the last stage) / (1 - the schedule's
//               bubble), at the efficiency of a microbatch's tokens; the traffic above of a rank's stages over
//               world / pp data-parallel ranks, gathered for every microbatch; each microbatch's (rows, T, C)
//               activations forward and their gradients back across the pipeline's link (inter-node when the job
//               spans nodes), hidden as communication is; its gradients reduced once a step (the stages' full
//               gradients kept between microbatches) or after every microbatch (train.sync_each_batch), both tried
//   optimizer with CPU offload, the step on the host after backward (nothing to overlap with): each rank's shard
//               of the trainable parameters x 28 bytes (fused AdamW reads parameter, gradient and both moments and
//               writes three back, float32) over the host memory bandwidth a GPU's rank gets; configurations whose
//               host memory per node (the offloaded state of its GPUs' ranks) exceeds the node's are left out;
//               with the disk tier (parallel.offload: nvme) no shorter than reading and writing the moments at
//               disk_gbps (they stream through the host as the step runs)
//   step time = compute + exposed + optimizer;  items/s = world / tp x batch x items per sample / step time;
//               tokens/s per GPU the same in text tokens (and image patches) over the GPUs; MFU = the model's
//               FLOPs per second per GPU (the replayed forward not counted) over the GPU's peak at the precision
//
// The GPU's constants come from a preset (gpu_spec: H100, H200, A100-40GB/80GB, L40S), each overridable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/models/lora_spec.h"
#include "shardtrain/plan/memory_model.h"
#include "shardtrain/memory/memory_size.h"

namespace shardtrain::plan {

struct Cluster {
  std::string gpu = "a100-40gb";    // the preset the constants below came from (gpu_spec), for the reader
  int64_t gpus = 8;                                  // in all
  int64_t nodes = 1;
  int64_t gpu_memory = 40LL * 1024 * 1024 * 1024;    // bytes per GPU
  double memory_margin = 0.05;      // kept free beyond the estimate (which has the CUDA allocator's allowance)
  double peak_tflops_bf16 = 312;    // A100's dense bf16/fp16
  double peak_tflops_fp32 = 156;    // A100's TF32 (float32 matmuls with train.tf32, the FLAVA post's setting)
  double peak_tflops_fp8 = 0;       // float8 tensor cores' dense peak; 0: none (A100: float8 GEMMs at bf16's)
  double hbm_gbps = 1555;           // GB/s of device memory (A100 40GB): float8's casts, which only move bytes
  // Bytes of device memory a float8 cast moves an element of bf16: nn::to_float8's passes — the amax (read 2), the
  // scaled product in float32 (read 2, write 4), clamped in place (read 4, write 4), the cast (read 4, write 1) —
  // 21; a fused cast (torch.compile's: read twice, write once) 5.
  double float8_cast_bytes = 21;
  double efficiency = 0.8;          // achieved / peak FLOP/s of the computation itself, large and wide (the preset's)
  double half_efficiency_tokens = 512;   // tokens per GPU per micro-batch at which half of `efficiency` is reached
  double half_efficiency_width = 256;    // layer width at which half of `efficiency` is reached
  double intra_node_gbps = 150;     // GB/s each GPU moves in a collective within a node (A100 NVLink, effective)
  double inter_node_gbps = 12.5;    // GB/s per GPU across nodes (100 Gb/s per GPU)
  double pcie_gbps = 12;            // GB/s host <-> GPU (CPU offload)
  double host_memory_gbps = 40;     // GB/s of host memory bandwidth a GPU's rank gets (the CPU optimizer step)
  int64_t host_memory = 1024LL * 1024 * 1024 * 1024;  // bytes of host memory per node (CPU offload's state)
  double disk_gbps = 2;             // GB/s of local disk (NVMe) a GPU's rank gets, each way (the disk tier)
  double overlap = 0.8;             // share of communication hidden behind computation (per-layer units)
  int64_t seq_len = 0;              // text tokens; 0: default_tokens
  int64_t max_batch = 4096;         // the search's upper bound
  // Samples an optimizer step, over all data-parallel ranks: each configuration splits it into micro-batches x
  // accumulation x data-parallel ranks (split_global_batch). 0: each at its largest batch, no accumulation.
  int64_t global_batch = 0;
  // train.fp8: every configuration trains the transformer layers' projections in float8 with this recipe; unset:
  // none. float8_all_gather: tensorwise under a strategy that shards, their weights gathered in float8
  // (train.fp8_all_gather; torchtitan's setting).
  std::optional<parallel::Float8Recipe> float8;
  bool float8_all_gather = true;
};

struct PlannedConfig {
  TrainingJob job;           // at its largest batch
  MemoryEstimate memory;     // at that batch
  double step_seconds = 0, compute_seconds = 0, comm_seconds = 0;
  double optimizer_seconds = 0;  // the CPU optimizer step (CPU offload), else 0: the device's is in compute
  double items_per_second = 0;  // over the whole cluster (FLAVA counts texts and images, as its post does)
  double tokens_per_second_per_gpu = 0;  // text tokens and image patches
  double tflops_per_gpu = 0;    // model FLOPs achieved
  double mfu = 0;               // tflops_per_gpu over the GPU's peak at the job's precision
};

// A GPU's constants for the planner: dense peak FLOP/s (bf16, TF32 for float32 matmuls, float8), memory and its
// bandwidth, the bandwidth each GPU moves in a collective within a node (NVLink's effective all-reduce rate, or
// PCIe's without it) and to the host.
struct GpuSpec {
  std::string name, description;
  int64_t memory = 0;  // bytes
  double peak_tflops_bf16 = 0, peak_tflops_fp32 = 0, intra_node_gbps = 0, pcie_gbps = 0;
  double efficiency = 0;  // Cluster::efficiency on this GPU
  std::string efficiency_from;  // what `efficiency` was fitted to, or that it was not
  double peak_tflops_fp8 = 0, hbm_gbps = 0;  // Cluster's
};
// The presets, in the order `plan --help` lists them.
std::vector<GpuSpec> gpu_specs();
// The preset named `name` (case-insensitive); std::invalid_argument naming the presets otherwise.
GpuSpec gpu_spec(const std::string& name);
// `cluster` with the preset's constants (and its name).
Cluster with_gpu(Cluster cluster, const GpuSpec& gpu);

// The largest local batch of `job` (its batch ignored) whose predicted peak fits the cluster's GPU memory less the
// margin, and what its node's ranks offload the node's host memory; 0 when not even one sample fits.
// The text length a plan assumes when none is given: the model's maximum up to kDefaultTokens, the length Llama 3
// trains at in torchtitan's tables (a 128k-token maximum is a limit for inference, not a training length); 512 for
// a model without one.
constexpr int64_t kDefaultTokens = 8192;
int64_t default_tokens(const models::ModelRecipe& recipe);

int64_t largest_batch(const models::ModelRecipe& recipe, const ModelShape& shape, TrainingJob job,
                      const Cluster& cluster);

// `job` (at its largest micro-batch, job.batch) made to train cluster.global_batch samples a step: its
// data-parallel ranks' share in the largest micro-batch that divides it and fits with the accumulation that makes
// it up (job.batch, job.grad_accum). False when the data-parallel ranks do not divide the global batch.
bool split_global_batch(const models::ModelRecipe& recipe, const ModelShape& shape, TrainingJob& job,
                        const Cluster& cluster);

// Predicted speed of `job` at its batch (and accumulation).
PlannedConfig predict(const models::ModelRecipe& recipe, const ModelShape& shape, const TrainingJob& job,
                      const Cluster& cluster);

// Every configuration (tensor-parallel size x strategy x activation checkpointing of every layer, every other
// layer or none x mixed precision x CPU offload x wrap) that fits with a batch of at least one, at its largest batch (or the split of cluster.global_batch),
// fastest first; with activation offload on each where none fits without it, and then with the optimizer's state
// on disk too (offload: nvme) where none fits yet (the host memory too small for CPU offload's state). Throws std::invalid_argument for a cluster whose GPUs do not divide into its nodes.
std::vector<PlannedConfig> plan_configurations(const models::ModelRecipe& recipe, const Cluster& cluster);

// The model's stated uncertainty: predictions within this share of each other are not told apart.
constexpr double kPlanTolerance = 0.10;

// The configuration to run among `configs` (fastest first, non-empty): among those within kPlanTolerance of the
// fastest, the first with the fewest departures from plain data parallelism (layers split over GPUs, CPU offload,
// activation offload, pure bf16) — the simpler layout, as practitioners choose it (torchtitan trains Llama 3 8B on a
// node with FSDP alone, in mixed precision). Its index.
size_t recommended(const std::vector<PlannedConfig>& configs);

// Why `chosen` (an index into `configs`, recommended's): a simpler layout within the model's tolerance of the
// fastest, or why the fastest does or does not split layers over GPUs (the best of the other kind, or that none
// fits). One line, "why: ...".
std::string recommendation_reason(const std::vector<PlannedConfig>& configs, size_t chosen);

// The trainer's keys for `job`'s layout as (dotted path, YAML value), in a config's order: parallel.strategy,
// activation checkpointing, offload, wrap, tensor and pipeline parallelism, then train.batch_size, grad_accum and
// sync_each_batch. Not the precision, the device, the world or the disk tier's nvme_path (trainer_yaml writes
// those; parallel.layout: auto keeps the config's).
std::vector<std::pair<std::string, std::string>> layout_keys(const TrainingJob& job);

// A `shardtrain train` config for a planned configuration of `model`: model.from for a model directory with weights
// or a name in the Hugging Face cache, else model.flavor (a zoo flavor, or a config.json: random weights); with
// `lora` enabled, model.lora (r, lora_alpha, target_modules).
std::string trainer_yaml(const std::string& model, const PlannedConfig& config, const models::LoraSpec& lora = {});

}  // namespace shardtrain::plan
