#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/planner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "plan/step_layout.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/weight_files.h"
#include "shardtrain/util/ascii_case.h"

namespace shardtrain::plan {

namespace {

// A batch of the task's largest kind, of meta tensors: only its shapes are read (training_flops), nothing allocated.
data::Batch shape_batch(const models::DataNeeds& needs, int64_t batch, int64_t tokens) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  data::Batch b;
  b.kind = needs.largest_kind();
  if (b.kind != data::SampleKind::IMAGE) {
    b.input_ids = at::empty({batch, tokens}, meta.dtype(at::kLong));
    b.texts = batch;
  }
  if (b.kind != data::SampleKind::TEXT) {
    b.pixels = at::empty({batch, 3, needs.image_size, needs.image_size}, meta.dtype(at::kFloat));
    b.images = batch;
  }
  return b;
}

int64_t tokens_of(const models::ModelRecipe& recipe, int64_t seq_len) {
  return seq_len > 0 ? seq_len : default_tokens(recipe);
}

// Bytes a CPU AdamW step moves per parameter: parameter, gradient and both moments read, three written back, in
// float32 (optim::FusedAdamW's pass; docs/notes/benchmarks.md measured it at 0.7-1x this bound).
constexpr double kCpuAdamWBytesPerParameter = 28;

constexpr int64_t kGiB = 1024LL * 1024 * 1024;

// Whether `job` fits the cluster: its predicted peak within a GPU's memory less the margin kept free, and what a
// node's ranks offload within the node's host memory (activation offload's grows with the batch).
bool fits(const models::ModelRecipe& recipe, const ModelShape& shape, const TrainingJob& job,
          const Cluster& cluster) {
  const int64_t budget = static_cast<int64_t>(static_cast<double>(cluster.gpu_memory) * (1 - cluster.memory_margin));
  const int64_t per_node = cluster.gpus / std::max<int64_t>(cluster.nodes, 1);
  const MemoryEstimate e = estimate_training_memory(recipe, shape, job);
  return e.peak_bytes <= budget && e.host_bytes * per_node <= cluster.host_memory;
}

// The layers' width: a transformer layer of width w holds about 12 w^2 parameters (attention's four w x w
// matrices, an MLP of 4w: 8 w^2), so sqrt(mean parameters / 12), the rank's slices under tensor parallelism.
double layer_width(const ModelShape& shape) {
  if (shape.layer_numel.empty()) return 0;
  double sum = 0;
  for (int64_t n : shape.layer_numel) sum += static_cast<double>(n);
  return std::sqrt(sum / static_cast<double>(shape.layer_numel.size()) / 12);
}

// The precisions planned: bf16 mixed precision (float32 parameters and AdamW state), float32, and pure bf16 (bf16
// parameters and gradients, AnyPrecision AdamW's bf16 moments with Kahan summation: 6 bytes of state a parameter,
// the T5 post's setting).
struct PlannedPrecision {
  parallel::Precision mixed;
  int64_t param_bytes;
};
constexpr PlannedPrecision kPrecisions[] = {
    {parallel::Precision::BF16, 4}, {parallel::Precision::NO, 4}, {parallel::Precision::NO, 2}};

}  // namespace

std::vector<GpuSpec> gpu_specs() {
  // Dense peaks (no sparsity); the collective bandwidth an effective all-reduce rate within a node: NVLink 3's
  // 150 GB/s a GPU (A100), 1.5x on NVLink 4 (H100, H200), PCIe's without NVLink (L40S).
  // The efficiency: what published runs reach (published_runs(): torchtitan's Llama on 64 A100s reaches 57-61% MFU,
  // its Llama 3.1 8B on 8 H100s at 500 W 33-39%: H100's peak is the harder to approach).
  const std::string a100 = "fitted to torchtitan's Llama 2 and 3 runs on 64 A100-80GB";
  const std::string h100 = "fitted to torchtitan's Llama 3.1 runs on H100 (500 W)";
  return {
      {"a100-40gb", "A100 SXM 40GB (NVLink 3)", 40 * kGiB, 312, 156, 150, 12, 0.8, a100, 0, 1555},
      {"a100-80gb", "A100 SXM 80GB (NVLink 3)", 80 * kGiB, 312, 156, 150, 12, 0.8, a100, 0, 2039},
      {"h100", "H100 SXM 80GB (NVLink 4)", 80 * kGiB, 989, 495, 225, 24, 0.4, h100, 1979, 3350},
      {"h200", "H200 SXM 141GB (NVLink 4)", 140 * kGiB, 989, 495, 225, 24, 0.4, "H100's (no published run on H200)",
       1979, 4800},
      {"l40s", "L40S 48GB (PCIe 4, no NVLink)", 45 * kGiB, 362, 183, 12, 12, 0.45, "not fitted (no published run)",
       733, 864},
  };
}

GpuSpec gpu_spec(const std::string& name) {
  const std::string wanted = util::ascii_lower(name);
  std::string names;
  for (const GpuSpec& g : gpu_specs()) {
    if (g.name == wanted) return g;
    names += (names.empty() ? "" : ", ") + g.name;
  }
  throw std::invalid_argument("--gpu: '" + name + "' is not a GPU the planner knows (expected one of " + names +
                              "; or give --gpu-memory and the --peak-tflops-* and bandwidth flags)");
}

bool split_global_batch(const models::ModelRecipe& recipe, const ModelShape& shape, TrainingJob& job,
                        const Cluster& cluster) {
  const int64_t dp = job.world / job.tp / job.pipeline.ranks, largest = job.batch;
  const int64_t unit = job.batch_unit();
  if (cluster.global_batch % dp != 0) return false;
  const int64_t local = cluster.global_batch / dp;
  for (int64_t micro = std::min(local, largest); micro >= 1; --micro) {
    if (local % micro != 0 || micro % unit != 0) continue;
    TrainingJob candidate = job;
    candidate.batch = micro, candidate.grad_accum = local / micro;
    if (!fits(recipe, shape, candidate, cluster)) continue;
    job = candidate;
    return true;
  }
  return false;
}

Cluster with_gpu(Cluster cluster, const GpuSpec& gpu) {
  cluster.gpu = gpu.name, cluster.gpu_memory = gpu.memory;
  cluster.peak_tflops_bf16 = gpu.peak_tflops_bf16, cluster.peak_tflops_fp32 = gpu.peak_tflops_fp32;
  cluster.intra_node_gbps = gpu.intra_node_gbps, cluster.pcie_gbps = gpu.pcie_gbps;
  cluster.efficiency = gpu.efficiency;
  cluster.peak_tflops_fp8 = gpu.peak_tflops_fp8, cluster.hbm_gbps = gpu.hbm_gbps;
  return cluster;
}

int64_t default_tokens(const models::ModelRecipe& recipe) {
  const int64_t max = recipe.task()->data_needs().max_text_length;
  return max > 0 ? std::min(max, kDefaultTokens) : 512;
}

int64_t largest_batch(const models::ModelRecipe& recipe, const ModelShape& shape, TrainingJob job,
                      const Cluster& cluster) {
  // A pipeline's batch is a whole number of its microbatches: the search is over a microbatch's rows.
  const int64_t unit = job.batch_unit(), most = cluster.max_batch / unit;
  auto fits_at = [&](int64_t rows) {
    job.batch = rows * unit;
    return fits(recipe, shape, job, cluster);
  };
  if (most < 1 || !fits_at(1)) return 0;
  int64_t lo = 1, hi = 2;  // fits_at(lo); grow hi until it does not fit
  while (hi <= most && fits_at(hi)) lo = hi, hi *= 2;
  hi = std::min(hi, most + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits_at(mid) ? lo : hi) = mid;
  }
  return lo * unit;
}

PlannedConfig predict(const models::ModelRecipe& recipe, const ModelShape& shape, const TrainingJob& job,
                      const Cluster& cluster) {
  PlannedConfig p;
  p.job = job;
  p.memory = estimate_training_memory(recipe, shape, job);
  const auto task = recipe.task();
  const data::Batch b = shape_batch(task->data_needs(), job.batch, tokens_of(recipe, job.seq_len));
  const double model_flops = recipe.training_flops(b);
  const double replayed = job.activation_checkpointing
                              ? 1.0 / (3.0 * static_cast<double>(std::max<int64_t>(job.checkpoint_every, 1)))
                              : 0.0;
  const double flops = model_flops * (1 + replayed);
  const bool pure_bf16 = job.param_bytes == 2;
  const bool low = job.mixed_precision != parallel::Precision::NO || pure_bf16;
  const double peak = (low ? cluster.peak_tflops_bf16 : cluster.peak_tflops_fp32) * 1e12;
  const models::DataNeeds needs = task->data_needs();
  const int64_t side = needs.patch_size > 0 ? needs.image_size / needs.patch_size : 0;
  const double tokens = static_cast<double>(job.batch) *
                        static_cast<double>((b.input_ids.defined() ? b.input_ids.size(1) : 0) +
                                            (b.pixels.defined() ? side * side + 1 : 0));
  // Under tensor parallelism a rank computes its share of every layer (1 / tp of the FLOPs) in its slices, whose
  // width the rank's layer parameters give.
  const double tp = static_cast<double>(job.tp), width = layer_width(shape);
  // A pipeline: each rank computes its stages' share of the FLOPs (the busiest rank's sets the pace), a microbatch
  // at a time (the efficiency of its tokens), and waits in the schedule's bubble; its units gathered and its
  // gradients reduced over the stage's data-parallel ranks; each microbatch's activations cross every stage
  // boundary forward and their gradients back.
  const bool piped = job.pipeline.ranks > 1;
  const double pp = static_cast<double>(job.pipeline.ranks), M = static_cast<double>(job.batch_unit());
  double share = 1, bubble = 0;
  if (piped) {
    const std::vector<models::StageLayers> split =
        pipeline_stages(shape, job.pipeline.stages(), job.pipeline_split_points);
    std::vector<double> rank_cost(static_cast<size_t>(job.pipeline.ranks), 0);
    double total = 0;
    for (int s = 0; s < job.pipeline.stages(); ++s) {
      const models::StageLayers& run = split[static_cast<size_t>(s)];
      double cost = s + 1 == job.pipeline.stages() ? static_cast<double>(shape.output_numel) : 0;
      for (int64_t l = run.first; l < run.first + run.count; ++l) cost += static_cast<double>(shape.layer_numel[static_cast<size_t>(l)]);
      rank_cost[static_cast<size_t>(job.pipeline.rank_of(s))] += cost, total += cost;
    }
    share = *std::max_element(rank_cost.begin(), rank_cost.end()) / total;
    bubble = pp::nominal_bubble(job.pipeline);
  }
  const double micro_tokens = tokens / M;
  const double efficiency = cluster.efficiency * micro_tokens / (micro_tokens + cluster.half_efficiency_tokens) *
                            width / (width + cluster.half_efficiency_width);
  // Gradient accumulation: A micro-batches a step, each computed and its units gathered; the gradients reduced (and
  // the optimizer stepped) once.
  const double A = static_cast<double>(std::max<int64_t>(job.grad_accum, 1));
  const double W = static_cast<double>(job.world / job.tp / job.pipeline.ranks);  // data-parallel ranks
  // Float8 (train.fp8): the converted projections' three GEMMs (6 FLOPs a weight a token, replayed with their
  // layer) at the float8 peak — bf16's on a GPU without float8 tensor cores —, and their operands' casts, which
  // only move bytes (Cluster::float8_cast_bytes an element): a projection's input (for forward, and again for the
  // weight's gradient) and its output's gradient (once for each product); its weight forward and backward (with
  // the float8 all-gather, a shard's once a gather).
  const double float8_weights = static_cast<double>(
      std::accumulate(shape.layer_float8.begin(), shape.layer_float8.end(), int64_t{0}));  // a tensor rank's
  double flops8 = 0, casts = 0;
  if (job.float8) {
    const double io = static_cast<double>(
        std::accumulate(shape.layer_float8_io.begin(), shape.layer_float8_io.end(), int64_t{0}));
    const double weights = job.float8_all_gather ? 2 * float8_weights / W : 2 * float8_weights;
    flops8 = std::min(flops, 6 * float8_weights * tp * tokens * (1 + replayed));
    casts = cluster.float8_cast_bytes * (2 * io * tokens + weights * M) * (1 + replayed) / (cluster.hbm_gbps * 1e9);
  }
  const double peak8 = (cluster.peak_tflops_fp8 > 0 ? cluster.peak_tflops_fp8 : cluster.peak_tflops_bf16) * 1e12;
  p.compute_seconds =
      A * share * (((flops - flops8) / peak + flops8 / peak8) / tp / efficiency + casts) / (1 - bubble);

  // Parameters are gathered, gradients reduced over the data-parallel ranks: all of a rank's (its slices under
  // tensor parallelism; its stages' in a pipeline), and the trainable ones (LoRA: the adapters alone). A pipeline's
  // units are gathered for every microbatch.
  const double P = piped ? static_cast<double>(p.memory.parameters) : static_cast<double>(shape.parameters());
  const double G = static_cast<double>(piped ? p.memory.trainable : shape.trainable());
  // HYBRID strategies shard over W / nodes ranks and replicate over the nodes (the trainer's mesh); the pipeline
  // dimension is outermost, so a stage's ranks are consecutive and span nodes / pp nodes (one when pp >= nodes).
  const double nodes = static_cast<double>(std::max<int64_t>(job.nodes, 1));
  const double per_node = W / nodes, stage_nodes = piped ? std::max(1.0, nodes / pp) : nodes;
  const double ce = low ? 2 : 4, rd = job.mixed_precision == parallel::Precision::BF16 || pure_bf16 ? 2 : 4;
  const double intra = cluster.intra_node_gbps * 1e9;
  const double inter = (stage_nodes > 1 ? cluster.inter_node_gbps : cluster.intra_node_gbps) * 1e9;
  auto moved = [](double bytes, double ranks) { return ranks > 1 ? bytes * (ranks - 1) / ranks : 0.0; };
  // All-gathered per step: every parameter for forward and again for backward when resharded after forward, once
  // when not — and a unit called twice (FLAVA's encoders) once more in each (P2).
  const double P2 = static_cast<double>(p.memory.parameters_called_twice);
  // The float8 all-gather's projections in one byte an element.
  const double gathered_ce = job.float8_all_gather && shape.parameters() > 0
                                 ? ce - (ce - 1) * float8_weights / static_cast<double>(shape.parameters())
                                 : ce;
  const double resharding = (P + P2) * gathered_ce * 2 * M, keeping = (P + P2) * gathered_ce * M;
  // Gradients reduced once a step, or (a pipeline's train.sync_each_batch) after every microbatch.
  const double reductions = piped && job.sync_each_batch ? A * M : 1;
  double comm = 0;
  switch (job.strategy) {
    case parallel::Strategy::FULL_SHARD: comm = moved(A * resharding + reductions * G * rd, W) / inter; break;
    case parallel::Strategy::SHARD_GRAD_OP: comm = moved(A * keeping + reductions * G * rd, W) / inter; break;
    case parallel::Strategy::NO_SHARD:
    case parallel::Strategy::DDP: comm = moved(2 * G * rd, W) / inter; break;
    case parallel::Strategy::HYBRID_SHARD:
    case parallel::Strategy::HYBRID_SHARD_ZERO2: {
      const double gathered = job.strategy == parallel::Strategy::HYBRID_SHARD ? resharding : keeping;
      comm = moved(A * gathered + G * rd, per_node) / intra + moved(2 * G / per_node * rd, nodes) / inter;
      break;
    }
  }
  // CPU offload: a rank's shards cross PCIe to the device for every gather (twice a call when resharded after
  // forward), its reduced gradients back — the trainable parameters' only (LoRA: the adapters) — all in the
  // parameters' own dtype.
  if (job.cpu_offload && job.strategy != parallel::Strategy::DDP) {
    const bool hybrid = job.strategy == parallel::Strategy::HYBRID_SHARD || job.strategy == parallel::Strategy::HYBRID_SHARD_ZERO2;
    const double shard_ranks = job.strategy == parallel::Strategy::NO_SHARD ? 1 : hybrid ? per_node : W;  // a parameter's
    const bool reshards = job.strategy == parallel::Strategy::FULL_SHARD || job.strategy == parallel::Strategy::HYBRID_SHARD;
    const double gathered = A * (P + P2) * (reshards ? 2 : 1);
    comm += (gathered + G) / shard_ranks * static_cast<double>(job.param_bytes) / (cluster.pcie_gbps * 1e9);
    p.optimizer_seconds = G / shard_ranks * kCpuAdamWBytesPerParameter / (cluster.host_memory_gbps * 1e9);
    if (job.optimizer_on_disk) {  // the moments read and written, overlapping the host's step
      p.optimizer_seconds = std::max(p.optimizer_seconds,
                                     2 * static_cast<double>(p.memory.disk_bytes) / (cluster.disk_gbps * 1e9));
    }
  }
  // Activation offload: what a micro-batch's layers keep crosses PCIe to the host in forward and back in backward,
  // on a stream of its own beside the computation: hidden as communication is.
  if (job.activation_offload) {
    comm += A * 2 * static_cast<double>(p.memory.offloaded_activation_bytes) / (cluster.pcie_gbps * 1e9);
  }
  // Tensor parallelism: each layer's input (B, T, C) is summed over the group twice in forward (attention's and the
  // MLP's outputs) and twice in backward (their inputs' gradients), twice more with checkpointing (the replayed
  // forward); a ring all-reduce moves 2 (t - 1) / t of it (sequence parallel, the all-gather and reduce-scatter it
  // splits into, the same bytes), within a node, in the computation's path: never hidden.
  double tp_comm = 0;
  if (job.tp > 1) {
    models::ActivationQuery whole = activation_query(job);
    whole.tp = 1, whole.sequence_parallel = false;
    double inputs = 0;
    for (const models::LayerActivations& layer : recipe.activation_bytes(whole).layers) {
      inputs += static_cast<double>(layer.input);
    }
    const double passes = job.activation_checkpointing ? 6 : 4;
    // A pipeline rank: its stages' layers only.
    tp_comm = A * passes * inputs * share * 2 * (tp - 1) / tp / (cluster.intra_node_gbps * 1e9);
  }
  if (piped) {  // (rows, T, C) forward and its gradient back, per microbatch, across the pipeline's link
    // Each tensor-parallel rank sends its own copy, or its sequence slice under sequence parallelism; C the whole
    // width (a slice's layer parameters give C / sqrt(tp)).
    const double slice = job.sequence_parallel ? tp : 1;
    const double boundary = static_cast<double>(job.batch) / M * static_cast<double>(tokens_of(recipe, job.seq_len)) *
                            width * std::sqrt(tp) * ce / slice;
    const double link = (job.nodes > 1 ? cluster.inter_node_gbps : cluster.intra_node_gbps) * 1e9;
    comm += A * M * 2 * boundary / link;
  }
  p.comm_seconds = comm + tp_comm;
  const double hidden = job.wrap == parallel::Wrap::NONE ? 0.0 : cluster.overlap;
  const double exposed = std::max(comm * (1 - hidden), comm - p.compute_seconds) + tp_comm;
  p.step_seconds = p.compute_seconds + exposed + p.optimizer_seconds;
  const double items = static_cast<double>(b.texts + b.images);
  p.items_per_second = A * W * items / p.step_seconds;
  p.tokens_per_second_per_gpu = A * tokens / tp / pp / p.step_seconds;
  p.tflops_per_gpu = A * model_flops / tp / pp / p.step_seconds / 1e12;  // model FLOPs (the replayed one not counted)
  p.mfu = p.tflops_per_gpu * 1e12 / peak;
  return p;
}

std::vector<PlannedConfig> plan_configurations(const models::ModelRecipe& recipe, const Cluster& cluster) {
  if (cluster.gpus < 1 || cluster.nodes < 1 || cluster.gpus % cluster.nodes != 0) {
    throw std::invalid_argument(std::to_string(cluster.gpus) + " GPUs do not divide into " +
                                std::to_string(cluster.nodes) + " nodes (expected --gpus a multiple of --nodes)");
  }
  std::vector<parallel::Strategy> strategies = {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP,
                                                parallel::Strategy::DDP};
  if (cluster.nodes > 1) {
    strategies.push_back(parallel::Strategy::HYBRID_SHARD);
    strategies.push_back(parallel::Strategy::HYBRID_SHARD_ZERO2);
  }
  // Tensor-parallel sizes within a node, where the family has a plan the model's sizes fit; sequence parallel
  // where the plan can be (Megatron's and torchtitan's setting). Not with offload or one unit for the model. Each
  // size's shape built once.
  const int64_t per_node = cluster.gpus / cluster.nodes;
  const bool sequence = models::splits_sequence(recipe.tp_plan());
  std::map<int64_t, ModelShape> shapes;  // by tensor-parallel size
  for (int64_t tp = 1; tp <= per_node && per_node % tp == 0; tp *= 2) {
    try {
      shapes.emplace(tp, model_shape(recipe, tp));
    } catch (const std::invalid_argument&) {
      if (tp == 1) throw;  // else no plan, or sizes this tp does not divide
    }
  }
  // The layouts tried, (pp, tp): every tensor-parallel size, then pipelines (FSDP over each stage's ranks, no
  // offload) of 2, 4, ... ranks where the family has stages and each stage gets a layer, each beside every
  // tensor-parallel size the GPUs hold (the 3-D mesh): 1F1B over 4 microbatches a pipeline rank.
  std::vector<std::pair<int64_t, int64_t>> layouts;
  for (const auto& sized : shapes) layouts.emplace_back(1, sized.first);
  const int64_t layers = static_cast<int64_t>(shapes.at(1).layer_numel.size());
  if (recipe.pipeline_stages_refused().empty()) {
    for (int64_t pp = 2; pp <= cluster.gpus && pp <= layers; pp *= 2) {
      for (const auto& sized : shapes) {
        if (cluster.gpus % (pp * sized.first) == 0) layouts.emplace_back(pp, sized.first);
      }
    }
  }
  std::vector<PlannedConfig> out;
  auto enumerate = [&](bool activation_offload, bool disk) {
    for (const auto& [pp, tp] : layouts) {
      const ModelShape& shape = shapes.at(tp);
      for (parallel::Strategy strategy : strategies) {
        for (const PlannedPrecision& precision : kPrecisions) {
          for (int64_t ac_every : {0, 1, 2}) {  // none, every layer, every other (torchtitan's "selective layer")
            for (bool offload : disk ? std::vector<bool>{true} : std::vector<bool>{false, true}) {
              for (parallel::Wrap wrap : {parallel::Wrap::TRANSFORMER, parallel::Wrap::NONE}) {
                const bool fsdp = strategy != parallel::Strategy::DDP;
                if (!fsdp && (offload || wrap == parallel::Wrap::NONE)) continue;  // DDP has neither
                if (tp > 1 && (offload || wrap == parallel::Wrap::NONE)) continue;
                if (precision.param_bytes == 2 && offload) continue;  // AnyPrecision's host step is not priced
                // float8 beside bf16 (torchao's; the trainer refuses it beside float16's loss scaling)
                if (cluster.float8 && precision.mixed == parallel::Precision::NO && precision.param_bytes == 4) {
                  continue;
                }
                if (pp > 1 && (!fsdp || offload || wrap == parallel::Wrap::NONE || activation_offload)) continue;
                TrainingJob job;
                job.world = cluster.gpus, job.nodes = cluster.nodes, job.strategy = strategy, job.wrap = wrap;
                job.tp = tp, job.sequence_parallel = tp > 1 && sequence;
                job.mixed_precision = precision.mixed, job.cpu_offload = offload;
                job.param_bytes = precision.param_bytes;
                if (precision.param_bytes == 2) job.optimizer = "AnyPrecision AdamW", job.optimizer_state_bytes = 6;
                job.activation_checkpointing = ac_every > 0, job.checkpoint_every = std::max<int64_t>(ac_every, 1);
                job.activation_offload = activation_offload, job.optimizer_on_disk = disk;
                job.seq_len = tokens_of(recipe, cluster.seq_len), job.device = parallel::Device::CUDA;
                job.float8 = cluster.float8;
                job.float8_all_gather = cluster.float8_all_gather &&
                                        cluster.float8 == parallel::Float8Recipe::TENSORWISE && fsdp &&
                                        strategy != parallel::Strategy::NO_SHARD;
                if (pp > 1) {
                  job.pipeline.kind = parallel::PipelineSchedule::ONE_F_ONE_B;
                  job.pipeline.ranks = static_cast<int>(pp), job.pipeline.microbatches = static_cast<int>(4 * pp);
                }
                // A pipeline keeps its stages' full gradients between microbatches, or reduces after each
                // (train.sync_each_batch): memory against communication, both tried.
                const bool reduces = cluster.gpus / tp / pp > 1 && strategy != parallel::Strategy::NO_SHARD;
                for (bool sync_each : pp > 1 && reduces ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
                  TrainingJob tried = job;
                  tried.sync_each_batch = sync_each;
                  tried.batch = largest_batch(recipe, shape, tried, cluster);
                  if (tried.batch < 1) continue;
                  if (cluster.global_batch > 0 && !split_global_batch(recipe, shape, tried, cluster)) continue;
                  out.push_back(predict(recipe, shape, tried, cluster));
                }
              }
            }
          }
        }
      }
    }
  };
  // Activation offload only where nothing else fits: it buys memory with PCIe traffic and host memory, and at its
  // larger batches the efficiency curve would rank it ahead of what practitioners run. The disk tier last, with and
  // without it: the optimizer's state leaves a host memory too small for it, for a step as slow as the disk.
  enumerate(false, false);
  if (out.empty()) enumerate(true, false);
  if (out.empty()) enumerate(false, true), enumerate(true, true);
  std::stable_sort(out.begin(), out.end(), [](const PlannedConfig& a, const PlannedConfig& b) {
    return a.items_per_second > b.items_per_second;
  });
  return out;
}

size_t recommended(const std::vector<PlannedConfig>& configs) {
  // What a layout asks of its user beyond data parallelism: layers split over GPUs, state or activations moved to
  // the host, parameters kept in bf16 (numerics to watch).
  auto departures = [](const TrainingJob& j) {
    return (j.tp > 1 || j.pipeline.ranks > 1) + j.cpu_offload + j.activation_offload + (j.param_bytes == 2);
  };
  size_t best = 0;
  for (size_t i = 1; i < configs.size(); ++i) {
    if (configs[i].items_per_second < (1 - kPlanTolerance) * configs.front().items_per_second) break;
    if (departures(configs[i].job) < departures(configs[best].job)) best = i;
  }
  return best;
}

std::string recommendation_reason(const std::vector<PlannedConfig>& configs, size_t chosen) {
  const PlannedConfig& best = configs[chosen];
  char line[400];
  if (chosen != 0) {
    const PlannedConfig& fastest = configs.front();
    std::snprintf(line, sizeof line,
                  "why: #%zu is the simpler layout (fewer of: layers split, offload, pure bf16), %.3g items/s "
                  "against %.3g for #1 (%.0f%% apart, within the model's %.0f%%)\n",
                  chosen + 1, best.items_per_second, fastest.items_per_second,
                  100 * (1 - best.items_per_second / fastest.items_per_second), 100 * kPlanTolerance);
    return line;
  }
  // Layers split over GPUs (tensor parallelism or a pipeline) against data parallelism alone.
  auto splits = [](const TrainingJob& j) { return j.tp > 1 || j.pipeline.ranks > 1; };
  // "a pipeline over 4 x tensor parallelism over 2", "tensor parallelism over 2", "a pipeline over 4".
  auto layout = [](const TrainingJob& j) {
    const std::string piped = j.pipeline.ranks > 1 ? "a pipeline over " + std::to_string(j.pipeline.ranks) : "";
    const std::string split = j.tp > 1 ? "tensor parallelism over " + std::to_string(j.tp) : "";
    return piped + (!piped.empty() && !split.empty() ? " x " : "") + split;
  };
  const bool split = splits(best.job);
  const auto other = std::find_if(configs.begin(), configs.end(),
                                  [&](const PlannedConfig& c) { return splits(c.job) != split; });
  if (other == configs.end()) {
    std::snprintf(line, sizeof line, "why: %s\n",
                  split ? "without splitting the layers (tensor parallelism, a pipeline) not even one sample per GPU "
                          "fits"
                        : "no configuration splitting the layers fits (the family has no plan or stages, or its "
                          "sizes do not divide)");
    return line;
  }
  const PlannedConfig& o = *other;
  std::snprintf(line, sizeof line,
                "why: %s %.3g items/s against %.3g for the best %s (%s%s, batch %lld per data-parallel rank)\n",
                split ? (layout(best.job) + " GPUs:").c_str() : "data parallelism alone:",
                best.items_per_second, o.items_per_second,
                split ? "without splitting the layers" : ("with " + layout(o.job)).c_str(),
                parallel::to_string(o.job.strategy).c_str(), o.job.cpu_offload ? " + CPU offload" : "",
                static_cast<long long>(o.job.batch));
  return line;
}

namespace {

// model.from for weights to fine-tune (a model directory holding them, or a name in the Hugging Face cache), else
// model.flavor (a zoo flavor, or a config.json or a directory of one alone: the architecture, random weights).
std::string model_section(const std::string& model) {
  const bool weights = io::path_exists(model)
                           ? io::is_directory(model) && io::has_weight_files(model)
                           : model.find('/') != std::string::npos;  // "org/name": the cache's snapshot
  return std::string("model:\n  ") + (weights ? "from: " : "flavor: ") + model + "\n";
}

std::string lora_section(const models::LoraSpec& lora) {
  if (!lora.enabled()) return "";
  std::string targets;
  for (const std::string& t : lora.target_modules) targets += (targets.empty() ? "" : ", ") + t;
  char text[160];
  std::snprintf(text, sizeof text, "  lora:\n    r: %lld\n    lora_alpha: %g\n", static_cast<long long>(lora.r),
                lora.lora_alpha);
  return text + (targets.empty() ? "" : "    target_modules: [" + targets + "]\n");
}

}  // namespace

std::vector<std::pair<std::string, std::string>> layout_keys(const TrainingJob& j) {
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  std::vector<std::pair<std::string, std::string>> keys = {
      {"parallel.strategy", parallel::to_string(j.strategy)},
      {"parallel.activation_checkpointing", flag(j.activation_checkpointing)}};
  if (j.activation_checkpointing && j.checkpoint_every > 1) {
    keys.emplace_back("parallel.activation_checkpointing_every", std::to_string(j.checkpoint_every));
  }
  keys.emplace_back("parallel.offload", j.optimizer_on_disk ? "nvme" : j.cpu_offload ? "cpu" : "none");
  if (j.activation_offload) keys.emplace_back("parallel.activation_offload", "true");
  keys.emplace_back("parallel.wrap", parallel::to_string(j.wrap));
  if (j.tp > 1) {
    keys.emplace_back("parallel.tp_size", std::to_string(j.tp));
    keys.emplace_back("parallel.sequence_parallel", flag(j.sequence_parallel));
  }
  if (j.pipeline.ranks > 1) {
    keys.emplace_back("parallel.pp_size", std::to_string(j.pipeline.ranks));
    keys.emplace_back("parallel.pp_schedule", parallel::to_string(j.pipeline.kind));
    keys.emplace_back("parallel.pp_microbatches", std::to_string(j.pipeline.microbatches));
    if (j.pipeline.stages_per_rank > 1) {
      keys.emplace_back("parallel.pp_stages_per_rank", std::to_string(j.pipeline.stages_per_rank));
    }
  }
  keys.emplace_back("train.batch_size", std::to_string(j.batch));
  if (j.grad_accum > 1) keys.emplace_back("train.grad_accum", std::to_string(j.grad_accum));
  if (j.sync_each_batch) keys.emplace_back("train.sync_each_batch", "true");
  return keys;
}

std::string trainer_yaml(const std::string& model, const PlannedConfig& c, const models::LoraSpec& lora) {
  const TrainingJob& j = c.job;
  char head[512];
  std::snprintf(head, sizeof head,
                "# shardtrain plan: %s%s on %lld GPUs (%lld node%s): predicted peak %.2f GiB per GPU, %.3g items/s\n",
                model.c_str(), lora.enabled() ? " + LoRA" : "", static_cast<long long>(j.world),
                static_cast<long long>(j.nodes), j.nodes > 1 ? "s" : "",
                static_cast<double>(c.memory.peak_bytes) / (1024.0 * 1024 * 1024), c.items_per_second);
  std::string parallel_lines = "parallel:\n  mixed_precision: " + parallel::to_string(j.mixed_precision) + "\n";
  if (j.optimizer_on_disk) parallel_lines += "  nvme_path: /local/nvme  # a directory on a local disk\n";
  std::string train_lines = "train:\n  device: cuda\n";
  if (j.float8) train_lines += "  fp8: " + parallel::to_string(*j.float8) + "\n";
  if (j.float8_all_gather) train_lines += "  fp8_all_gather: true\n";
  for (const auto& [path, value] : layout_keys(j)) {
    const bool in_train = path.rfind("train.", 0) == 0;
    (in_train ? train_lines : parallel_lines) += "  " + path.substr(path.find('.') + 1) + ": " + value + "\n";
  }
  const std::string launch_lines = "launch:\n  num_processes: " + std::to_string(j.world) + "\n  num_machines: " +
                                   std::to_string(j.nodes) + "\n";
  // Pure bf16: the parameters in bf16 and AnyPrecision AdamW with Kahan summation (its moments in bf16).
  const bool pure = j.param_bytes == 2;
  const std::string optim = pure ? "optim:\n  name: anyprecision_adamw\n  use_kahan_summation: true\n" : "";
  return head + model_section(model) + (pure ? "  dtype: bfloat16\n" : "") + lora_section(lora) + parallel_lines +
         train_lines + launch_lines + optim;
}

}  // namespace shardtrain::plan
