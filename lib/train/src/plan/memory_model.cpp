#include "shardtrain/plan/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/step_layout.h"
#include "plan/step_phases.h"
#include "shardtrain/memory/memory_size.h"
#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::plan {

using memory::readable_size;

namespace {

// What the CUDA caching allocator holds above what tensors asked for (block rounding, fragmentation).
constexpr double kCudaAllocatorAllowance = 0.05;

// model_shape(recipe, tp, stages), through `whole`'s memo when it has one.
ModelShape stage_shape(const models::ModelRecipe& recipe, const ModelShape& whole, int64_t tp,
                       const std::vector<models::StageLayers>& stages) {
  if (!whole.stage_shapes) return model_shape(recipe, tp, stages);
  std::vector<int64_t> key = {tp};
  for (const models::StageLayers& run : stages) key.insert(key.end(), {run.first, run.count});
  auto it = whole.stage_shapes->find(key);
  if (it == whole.stage_shapes->end()) it = whole.stage_shapes->emplace(key, model_shape(recipe, tp, stages)).first;
  return it->second;
}

// A pipeline: each rank's stages estimated as a model of their own over the stage's data-parallel ranks, one
// microbatch a micro-batch (the step's microbatches x grad_accum of them: FSDP keeps the full gradients between
// them, reducing at the last), and the activations of the other microbatches the schedule holds at once on top;
// the rank needing most. `whole`: the model's shape, which the stages are cut from.
MemoryEstimate pipeline_estimate(const models::ModelRecipe& recipe, const ModelShape& whole, const TrainingJob& job) {
  const pp::ScheduleShape& shape = job.pipeline;
  if (job.world % (shape.ranks * job.tp) != 0) {
    throw std::invalid_argument("a pipeline of " + std::to_string(shape.ranks) + " ranks x tensor parallelism over " +
                                std::to_string(job.tp) + " does not divide a world of " + std::to_string(job.world));
  }
  if (job.batch % shape.microbatches != 0) {
    throw std::invalid_argument("batch size " + std::to_string(job.batch) + " does not split into " +
                                std::to_string(shape.microbatches) + " pipeline microbatches");
  }
  const std::vector<models::StageLayers> split = pipeline_stages(whole, shape.stages(), job.pipeline_split_points);
  const pp::Simulation simulated = pp::simulate(pp::make_schedule(shape));
  MemoryEstimate largest;
  for (int r = 0; r < shape.ranks; ++r) {
    TrainingJob stage = job;
    stage.pipeline = pp::ScheduleShape{};
    stage.world = job.world / shape.ranks, stage.nodes = std::max<int64_t>(1, job.nodes / shape.ranks);
    stage.batch = job.batch / shape.microbatches, stage.grad_accum = job.grad_accum * shape.microbatches;
    stage.stages = models::stages_of_rank(shape, split, r);
    stage.microbatches_held = simulated.peak_held.at(static_cast<size_t>(r));
    MemoryEstimate e = estimate_training_memory(recipe, stage_shape(recipe, whole, job.tp, stage.stages), stage);
    e.pp_rank = r;
    if (r == 0 || e.peak_bytes > largest.peak_bytes) largest = std::move(e);
  }
  return largest;
}

}  // namespace

MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const TrainingJob& job) {
  return estimate_training_memory(recipe, model_shape(recipe, job.tp, job.stages), job);
}

MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const ModelShape& shape,
                                        const TrainingJob& job) {
  if (job.pipeline.ranks > 1) return pipeline_estimate(recipe, shape, job);
  const StepLayout s = step_layout(recipe, shape, job);
  MemoryEstimate e;
  e.tokens = job.seq_len > 0 ? job.seq_len : recipe.task()->data_needs().max_text_length;
  e.parameters = s.parameters, e.trainable = shape.trainable();
  e.units = static_cast<int64_t>(s.units.numel.size()) + (s.units.extra_numel > 0 ? 1 : 0) +
            (s.units.input_numel > 0 ? 1 : 0) + (s.units.output_numel > 0 ? 1 : 0);
  // Host memory at its peak: CPU offload's at the step (shards, gradients, state, the step's temporaries); the
  // offloaded activations' at the end of forward, beside the offloaded shards and state.
  if (s.offload) e.host_bytes = s.params + s.grads + s.host_adam + step_temporaries(s);
  if (s.adam_on_disk) e.disk_bytes = s.adam;
  if (s.offload_activations) {
    e.offloaded_activation_bytes = s.offloaded_activations;
    e.host_bytes = std::max(e.host_bytes, (s.offload ? s.params + s.host_adam : 0) + s.offloaded_activations);
  }
  // Every storage a rank writes, copied whole: its unit shards (padded) and their optimizer state; under DDP and
  // no_shard the first replica's whole model (the estimate is of the rank needing most).
  if (job.async_checkpoint) e.checkpoint_staging_bytes = s.params + s.adam, e.host_bytes += e.checkpoint_staging_bytes;

  Moment forward = largest({forward_start(s), forward_loss(s), forward_layers(s)});
  Walk walk = backward_walk(s);
  e.parameters_called_twice = walk.parameters_called_twice;
  Moment backward = largest({backward_start(s), head_reduction(s), std::move(walk.peak), backward_end(s)});
  // A pipeline rank's schedule holds other microbatches' activations beside the one it computes. The layout walks
  // one microbatch through all of the rank's runs (an interleaved rank's: one pair per run, each one stage's share
  // of what they keep); the pairs beyond those are on top.
  const int64_t runs = static_cast<int64_t>(std::max<size_t>(1, job.stages.size()));
  if (job.microbatches_held > runs) {
    const int64_t more = job.microbatches_held - runs, others = more * s.kept / runs;
    const MemoryTerm term{"other microbatches in flight", others,
                          std::to_string(more) + " more (stage, microbatch) pairs' activations the schedule holds"};
    for (Moment* m : {&forward, &backward}) m->bytes += others, m->terms.push_back(term);
  }
  const Moment step = optimizer_step(s);
  e.forward_bytes = forward.bytes, e.backward_bytes = backward.bytes, e.step_bytes = step.bytes;
  const int64_t peak = std::max({e.forward_bytes, e.backward_bytes, e.step_bytes});
  e.peak_phase = peak == e.backward_bytes ? "backward" : peak == e.forward_bytes ? "forward" : "step";

  // The CUDA caching allocator rounds every block up and keeps freed blocks of other sizes apart: what it holds
  // runs above what tensors asked for. (The CPU count is of what tensors asked for.)
  const auto allowance = [&](int64_t bytes) {
    return job.device == parallel::Device::CUDA
               ? static_cast<int64_t>(static_cast<double>(bytes) * kCudaAllocatorAllowance)
               : 0;
  };
  const int64_t phase_allowance = allowance(peak);
  e.forward_bytes += allowance(e.forward_bytes), e.backward_bytes += allowance(e.backward_bytes);
  e.step_bytes += allowance(e.step_bytes);
  e.peak_bytes = std::max({e.forward_bytes, e.backward_bytes, e.step_bytes});

  if (phase_allowance > 0) {
    e.terms.push_back({"CUDA allocator allowance", phase_allowance,
                       "block rounding and fragmentation, " +
                           std::to_string(static_cast<int>(kCudaAllocatorAllowance * 100)) + "% of the rest"});
  }
  const std::string per = s.per_ranks();
  e.terms.push_back({"parameters", s.dev_params,
                     std::to_string(s.shard_numel) + " elements x " + std::to_string(s.pe) + " B" + per +
                         (s.offload ? " (offloaded: host)" : "")});
  e.terms.push_back({job.optimizer + " state", s.dev_adam,
                     std::to_string(job.optimizer_state_bytes) + " B per trainable parameter" + per});
  if (s.accumulated > 0 && e.peak_phase != "step") {
    e.terms.push_back({"accumulated gradients", s.accumulated,
                       s.accumulated == s.dev_grads ? "kept between micro-batches in .grad"
                                                    : "every unit's full ones, kept between micro-batches "
                                                      "(train.sync_each_batch: sharded ones only)"});
  }
  const Moment& at_peak = e.peak_phase == "backward" ? backward : e.peak_phase == "forward" ? forward : step;
  e.terms.insert(e.terms.end(), at_peak.terms.begin(), at_peak.terms.end());
  return e;
}

std::string format_estimate(const std::string& model, const TrainingJob& job, const MemoryEstimate& e) {
  std::string out = "Training memory per rank for `" + model + "`: " + parallel::to_string(job.strategy) + ", " +
                    std::to_string(job.world) + " ranks" +
                    (job.nodes > 1 ? " on " + std::to_string(job.nodes) + " nodes" : "") +
                    (job.tp > 1 ? ", tensor parallel over " + std::to_string(job.tp) +
                                      (job.sequence_parallel ? " (sequence parallel)" : "")
                                : "") +
                    ", batch " +
                    std::to_string(job.batch) + (job.tp > 1 ? " per data-parallel rank" : " per rank") +
                    (e.tokens > 0 ? " x " + std::to_string(e.tokens) + " tokens" +
                                        (job.seq_len > 0 ? "" : " (the model's maximum)")
                                  : "") +
                    ", mixed precision " + parallel::to_string(job.mixed_precision) +
                    (job.activation_checkpointing
                         ? job.checkpoint_every > 1 ? ", activation checkpointing of every " +
                                                          std::to_string(job.checkpoint_every) + "th layer"
                                                    : ", activation checkpointing"
                         : "") +
                    (job.grad_accum > 1 ? ", " + std::to_string(job.grad_accum) + " micro-batches" +
                                              (job.sync_each_batch ? " (each reduced)" : "")
                                        : "") +
                    (job.cpu_offload ? (job.optimizer_on_disk ? ", NVMe offload" : ", CPU offload") : "") +
                    (job.activation_offload ? ", activation offload" : "") +
                    (job.pipeline.ranks > 1
                         ? ", pipeline of " + std::to_string(job.pipeline.ranks) + " ranks (" +
                               parallel::to_string(job.pipeline.kind) + ", " +
                               std::to_string(job.pipeline.microbatches) + " microbatches)"
                         : "") +
                    (job.device == parallel::Device::CUDA ? " (CUDA)" : " (CPU)") + "\n";
  out += "  " + std::to_string(e.parameters) + " parameters" +
         (job.tp > 1 ? " of a tensor-parallel rank's slices" : "") +
         (job.pipeline.ranks > 1 ? " of pipeline rank " + std::to_string(e.pp_rank) + "'s stages (the rank needing "
                                                                                       "most)"
                                 : "") +
         " in " + std::to_string(e.units) + " units\n";
  char line[256];
  for (const auto& t : e.terms) {
    std::snprintf(line, sizeof line, "  %-48s %14s   %s\n", t.name.c_str(), readable_size(t.bytes).c_str(),
                  t.note.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-48s %14s   (forward %s, backward %s, step %s)\n",
                ("peak (" + e.peak_phase + ")").c_str(), readable_size(e.peak_bytes).c_str(),
                readable_size(e.forward_bytes).c_str(), readable_size(e.backward_bytes).c_str(),
                readable_size(e.step_bytes).c_str());
  out += line;
  if (e.host_bytes > 0) {
    std::vector<std::string> held;  // what the host holds at its peak
    if (job.cpu_offload) {
      held.push_back(job.optimizer_on_disk ? "offloaded shards, gradients, AdamW state's staging buffers, the step's "
                                             "temporaries"
                                           : "offloaded shards, gradients, AdamW state, the step's temporaries");
    }
    if (job.activation_offload) held.push_back("the layers' activations at the end of forward");
    if (e.checkpoint_staging_bytes > 0) {
      held.push_back("checkpoint.async's staging buffer " + readable_size(e.checkpoint_staging_bytes));
    }
    std::string what;
    for (const std::string& h : held) what += (what.empty() ? "" : "; ") + h;
    out += "  host memory (" + what + "): " + readable_size(e.host_bytes) + "\n";
  }
  if (e.disk_bytes > 0) out += "  disk (AdamW's state): " + readable_size(e.disk_bytes) + "\n";
  return out;
}

std::string estimate_json(const std::string& model, const TrainingJob& job, const MemoryEstimate& e) {
  nlohmann::json j;
  j["model"] = model;
  j["job"] = {{"world", job.world},           {"nodes", job.nodes}, {"tp", job.tp},
              {"sequence_parallel", job.sequence_parallel},
              {"strategy", parallel::to_string(job.strategy)}, {"mixed_precision", parallel::to_string(job.mixed_precision)},
              {"activation_checkpointing", job.activation_checkpointing}, {"cpu_offload", job.cpu_offload},
              {"activation_offload", job.activation_offload}, {"optimizer_on_disk", job.optimizer_on_disk},
              {"async_checkpoint", job.async_checkpoint},
              {"batch", job.batch},           {"seq_len", job.seq_len}, {"cuda", job.device == parallel::Device::CUDA}};
  j["parameters"] = e.parameters, j["units"] = e.units, j["tokens"] = e.tokens;
  j["peak_bytes"] = e.peak_bytes, j["peak_phase"] = e.peak_phase;
  j["phases"] = {{"forward", e.forward_bytes}, {"backward", e.backward_bytes}, {"step", e.step_bytes}};
  j["host_bytes"] = e.host_bytes;
  j["disk_bytes"] = e.disk_bytes;
  j["checkpoint_staging_bytes"] = e.checkpoint_staging_bytes;
  for (const auto& t : e.terms) j["terms"].push_back({{"name", t.name}, {"bytes", t.bytes}, {"note", t.note}});
  return j.dump(2);
}

}  // namespace shardtrain::plan
