// The memory model: the peak bytes one rank needs for a training step of a model under a data-parallel
// configuration, broken down by term, computed from the model's module tree (built on the meta device: parameter
// counts per FSDP unit) and its recipe's activation function (models/activation_memory.h).
//
//   plan::TrainingJob job;
//   job.world = 8, job.strategy = parallel::Strategy::FULL_SHARD, job.batch = 16, job.activation_checkpointing = true;
//   plan::MemoryEstimate e = plan::estimate_training_memory(*models::recipe_of("flava-900m"), job);
//   e.peak_bytes; e.terms   // parameter shards, gradients, AdamW state, gathered units, activations, ...
//
// A step has three phases, each with its own peak (docs/notes/memory-model.md):
//   forward   parameters + AdamW state + gathered units + activations kept so far + the loss's logits
//   backward  parameters + AdamW state + gathered units + what is still kept + gradients so far, walked layer by
//             layer from the top (activations freed as gradients arrive), plus one unit's full gradients and its
//             reduce-scatter buffer
//   step      parameters + gradients + AdamW state + AdamW's temporaries
// Gradients do not outlive the step (zero_grad sets them to none), so forward holds none.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/models/build.h"
#include "shardtrain/models/recipe.h"
#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/pp/schedule.h"

namespace shardtrain::plan {

struct TrainingJob {
  int64_t world = 1;      // ranks in all
  int64_t nodes = 1;      // hybrid strategies shard within a node: world / nodes / tp ranks
  // Tensor parallelism (models/tensor_parallel.h): ranks that split each layer, within a node; data parallelism
  // (the strategy) is over world / tp ranks. sequence_parallel: the activations between the split regions are
  // split on the sequence too.
  int64_t tp = 1;
  bool sequence_parallel = false;
  // train.fp8: the transformer layers' projections in float8 with this recipe (ActivationQuery::float8); unset: none.
  std::optional<parallel::Float8Recipe> float8;
  // train.fp8_all_gather: FSDP gathers those projections' weights in e4m3 (ModelShape::layer_float8).
  bool float8_all_gather = false;
  // Pipeline parallelism (pp/schedule.h): pipeline.ranks ranks each holding its stages of the model (cut by
  // pipeline_stages), a rank's batch in pipeline.microbatches run by pipeline.kind; the strategy over the world /
  // (tp x pipeline.ranks) ranks of a stage. The estimate is that of the pipeline rank needing most
  // (MemoryEstimate::pp_rank). ranks 1: no pipeline.
  pp::ScheduleShape pipeline;
  std::vector<int64_t> pipeline_split_points;  // parallel.pp_split_points (empty: balanced)
  // One pipeline rank's part, as the estimate sets it for each: the runs of layers it holds (the model's shape is
  // theirs: model_shape(recipe, tp, stages)), and the most (stage, microbatch) pairs whose activations it holds at
  // once (pp::simulate). Empty: the whole model.
  std::vector<models::StageLayers> stages;
  int64_t microbatches_held = 1;
  parallel::Strategy strategy = parallel::Strategy::FULL_SHARD;
  // FSDP units: each transformer layer and the root (the trainer's wrap), or the whole model as one unit (FSDP's
  // default when no policy is given: the T5 post's "default wrapping"). Units closed at a size are modelled as the
  // transformer layers they mostly are.
  parallel::Wrap wrap = parallel::Wrap::TRANSFORMER;
  parallel::Precision mixed_precision = parallel::Precision::NO;  // the compute dtype of gathered units, activations
  bool activation_checkpointing = false;  // transformer layers replay their forward in backward
  int64_t forward_prefetch = 0;           // units gathered ahead in forward (parallel.forward_prefetch; at most one)
  int64_t checkpoint_every = 1;           // with checkpointing: every k-th layer (1: all)
  int64_t grad_accum = 1;                 // micro-batches per optimizer step
  bool sync_each_batch = false;           // reduce after every micro-batch (no full gradients kept between them)
  bool cpu_offload = false;               // shards, gradients and AdamW state in host memory
  bool optimizer_on_disk = false;         // with cpu_offload, AdamW's state on a local disk (optim/disk_adamw.h)
  // What each layer keeps for backward in host memory from its forward to its backward, two layers' back on the
  // device at once (nn/activation_offload.h)
  bool activation_offload = false;
  // checkpoint.async: a host staging buffer as large as what this rank writes of a checkpoint (its parameter shards
  // and optimizer state), held from the first save on.
  bool async_checkpoint = false;
  int64_t batch = 1;                      // samples per rank per micro-batch
  int64_t seq_len = 0;                    // text tokens; 0: the model's maximum
  parallel::Device device = parallel::Device::CPU;  // CUDA: its kernels and caching allocator
  // Optimizer state per trainable parameter: AdamW's two float32 moments (8 B); AnyPrecision AdamW's moments in
  // their dtypes, plus its compensation buffer with Kahan summation (bf16 throughout: 6 B).
  int64_t optimizer_state_bytes = 8;
  int64_t param_bytes = 4;  // the parameters' own element size (and their gradients'): 2 for pure bf16
  std::string optimizer = "AdamW";  // its name in the estimate's terms
  bool fused_optimizer = false;     // one fused kernel per step (optim.fused): no per-tensor temporaries
  // DDP (parallel.*): MiB of gradients per all-reduce bucket; gradients living in the buckets (no copies).
  double bucket_cap_mb = 25.0;
  bool gradient_as_bucket_view = false;
  // What the data pipeline masks (data.*): the heads run on masked positions only.
  double mlm_probability = 0.15, mim_probability = 0.4, itm_negative_probability = 0.5;

  // What `batch` is a whole number of: a pipeline's microbatches (1 without a pipeline).
  int64_t batch_unit() const { return pipeline.ranks > 1 ? pipeline.microbatches : 1; }
};

struct MemoryTerm {
  std::string name;   // "parameter shards", ...
  int64_t bytes = 0;  // as counted in the peak phase
  std::string note;   // how it was computed
};

struct MemoryEstimate {
  std::vector<MemoryTerm> terms;  // the peak phase's terms, in order
  std::string peak_phase;         // "forward", "backward" or "step"
  int64_t peak_bytes = 0;         // per rank, on the device
  int64_t forward_bytes = 0, backward_bytes = 0, step_bytes = 0;  // each phase's peak
  int64_t host_bytes = 0;         // host memory at its peak: CPU offload's state, offloaded activations
  int64_t offloaded_activation_bytes = 0;  // what a micro-batch's layers keep, in host memory (activation offload)
  int64_t disk_bytes = 0;          // the optimizer's state on disk (optimizer_on_disk), per rank
  int64_t checkpoint_staging_bytes = 0;  // async_checkpoint's staging buffer (in host_bytes too)
  int64_t parameters = 0;         // of the model, tied once (under tensor parallelism a rank's slices)
  int64_t trainable = 0;          // of those, the ones that get gradients (LoRA: the adapters)
  int64_t units = 0;              // FSDP units: one per transformer layer, plus the root
  int64_t tokens = 0;             // text tokens per sample estimated for (the model's maximum unless given); 0: none
  // Of the parameters, those in units called twice a step (FLAVA's encoder layers, unmasked then masked): gathered
  // once more in forward under FULL_SHARD, and in backward (fully_shard reshards them between the calls).
  int64_t parameters_called_twice = 0;
  int pp_rank = 0;  // a pipeline's: the rank whose stages this is (the one needing most)
};

// The model's parameters per FSDP unit (built once on the meta device; estimates for many jobs share it).
struct ModelShape {
  std::vector<int64_t> layer_numel, layer_trainable;  // per transformer layer
  // Per transformer layer, the elements of the projections train.fp8 converts (models::Float8Layers' rule, no
  // exclusions): those FSDP's float8 all-gather gathers in one byte.
  std::vector<int64_t> layer_float8;
  // Per transformer layer, those projections' input and output features summed (in + out of each): the elements
  // of a token's activations and gradients their float8 casts read (the planner's throughput model).
  std::vector<int64_t> layer_float8_io;
  int64_t root_numel = 0, root_trainable = 0;         // what no unit holds (embeddings, heads)
  // The recipe's extra units (ModelRecipe::extra_unit_classes: FLAVA's frozen codebook), all together: gathered
  // only while they compute, at the start of forward, without gradients.
  int64_t extra_numel = 0, extra_trainable = 0;
  // The edge units (ModelRecipe::edge_unit_classes: Llama's embedding and head): the input one gathered for its
  // forward (the first) and its backward (the last), the output one for the loss and its backward (the first).
  int64_t input_numel = 0, input_trainable = 0, output_numel = 0, output_trainable = 0;
  int64_t largest_trainable_tensor = 0;
  std::vector<int64_t> trainable_in_order;  // each trainable tensor's elements, in registration order (DDP's buckets)
  // Trainable root parameters no gradient reaches in the step the model walks (Task::modules_without_gradient).
  int64_t root_without_gradient = 0;
  std::vector<char> without_gradient_in_order;  // 1 for those, parallel to trainable_in_order
  // Trainable elements of the tables a lookup and the head share (ModelRecipe::tied_tables).
  int64_t tied_tables = 0;
  // Trainable root elements registered before the first layer, not tied (the embeddings'): their gradients come
  // at the end of backward, after every layer's.
  int64_t root_input_side = 0;
  // Elements of the tables only lookups read (models::LookupModule), all and the input edge unit's: autocast
  // makes no compute-dtype copy of them.
  int64_t lookup_tables = 0, input_lookup_tables = 0;
  // The tensor-parallel size the counts are one rank's of (rank 0's: where a vocabulary splits unevenly, the
  // largest part).
  int64_t tp = 1;
  // The shapes of pipeline ranks' stages cut from this model (model_shape(recipe, tp, stages)), by tp and their
  // runs' (first, count) pairs: each built once, then read by every estimate of its layout (the planner's search makes
  // thousands). Shared by copies; set by model_shape. Not thread-safe: one search at a time.
  std::shared_ptr<std::map<std::vector<int64_t>, ModelShape>> stage_shapes;
  int64_t parameters() const;
  int64_t trainable() const;  // the parameters that get gradients (LoRA: the adapters')
};
// Under tensor parallelism (tp > 1) the model is split by its recipe's plan as its rank 0 holds it. Throws
// std::invalid_argument as models::tensor_parallelize does for a plan the sizes do not fit. With `stages`, the part a
// pipeline rank holding those runs of layers builds (models::BuildOptions::stages).
ModelShape model_shape(const models::ModelRecipe& recipe, int64_t tp = 1,
                       const std::vector<models::StageLayers>& stages = {});

// The runs of layers a pipeline of `stages` stages cuts the model into: at `split_points` when given
// (parallel.pp_split_points: models::split_layers), else balanced by FLOPs per token, about 6 a parameter, the
// head's counted with the last stage (models::balanced_split). What `--print-schedule` prints, the trainer builds and
// the memory model counts. Throws std::invalid_argument naming the numbers for more stages than layers or points
// out of order or range.
std::vector<models::StageLayers> pipeline_stages(const ModelShape& shape, int stages,
                                                 const std::vector<int64_t>& split_points = {});
// A line for each stage of `split` as `schedule` places them: "stage 3 (rank 3): layer 7 + norm, head, loss, 83,520
// parameters" (the embeddings on the first stage; the final norm, head and loss on the last).
std::vector<std::string> describe_pipeline_stages(const ModelShape& shape,
                                                  const std::vector<models::StageLayers>& split,
                                                  const pp::ScheduleShape& schedule);

// Throws std::invalid_argument when the world does not divide into the nodes, or the family's activations are not
// modelled. `shape`: model_shape(recipe, job.tp, job.stages) — with job.pipeline, the whole model's, which its
// stages are cut from.
MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const TrainingJob& job);
MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const ModelShape& shape,
                                        const TrainingJob& job);

// A human table of an estimate, and the same as JSON.
std::string format_estimate(const std::string& model, const TrainingJob& job, const MemoryEstimate& e);
std::string estimate_json(const std::string& model, const TrainingJob& job, const MemoryEstimate& e);

}  // namespace shardtrain::plan
