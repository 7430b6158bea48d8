#include "plan/step_layout.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/io/scratch_file.h"

namespace shardtrain::plan {

Units units_of(const ModelShape& shape, parallel::Wrap wrap) {
  Units u;
  if (wrap != parallel::Wrap::NONE) {
    u.numel = shape.layer_numel, u.trainable = shape.layer_trainable, u.float8 = shape.layer_float8;
    u.numel.push_back(shape.root_numel), u.trainable.push_back(shape.root_trainable), u.float8.push_back(0);
    u.extra_numel = shape.extra_numel, u.extra_trainable = shape.extra_trainable;
    u.input_numel = shape.input_numel, u.input_trainable = shape.input_trainable;
    u.output_numel = shape.output_numel, u.output_trainable = shape.output_trainable;
    return u;
  }
  return {{shape.parameters()}, {shape.trainable()},
          {std::accumulate(shape.layer_float8.begin(), shape.layer_float8.end(), int64_t{0})}};
}

// DDP's buckets (ddp::replicate): the trainable tensors in reverse registration order (backward's), a bucket closed
// once it holds `cap` bytes or more — so one may hold up to cap plus a tensor.
std::vector<int64_t> ddp_bucket_bytes(const std::vector<int64_t>& numel_in_order,
                                      const std::vector<char>& without_gradient, int64_t element_bytes, int64_t cap,
                                      size_t& first_blocked) {
  std::vector<int64_t> buckets;
  first_blocked = SIZE_MAX;
  for (size_t k = numel_in_order.size(); k-- > 0;) {
    if (buckets.empty() || buckets.back() >= cap) buckets.push_back(0);
    buckets.back() += numel_in_order[k] * element_bytes;
    if (k < without_gradient.size() && without_gradient[k]) {
      first_blocked = std::min(first_blocked, buckets.size() - 1);
    }
  }
  first_blocked = std::min(first_blocked, buckets.size());
  return buckets;
}

// The last two complete buckets (two at most are all-reduced at once; an earlier one is waited for, and its copy
// dropped, when a third starts). They start in order: none from the first blocked one on before the end of
// backward.
int64_t ddp_in_flight(const std::vector<int64_t>& buckets, int64_t done, size_t first_blocked) {
  size_t complete = 0;
  for (int64_t sum = 0; complete < first_blocked && sum + buckets[complete] <= done; ++complete) {
    sum += buckets[complete];
  }
  int64_t bytes = 0;
  for (size_t k = complete >= 2 ? complete - 2 : 0; k < complete; ++k) bytes += buckets[k];
  return bytes;
}

// A reduce-scatter holds its flat input (the unit's trainable parameters, in the reduce dtype: bf16 reduces in
// bf16, fp16 in float32), the output shard and the backend's scratch (Gloo's receive buffers and bf16's float32
// sum: dist::reduce_scatter_scratch_bytes). A replicated unit (NO_SHARD) all-reduces its flat buffer in place.
int64_t StepLayout::reduce_scatter(int64_t unit) const {
  if (replicated_fsdp) return unit * rd;
  const int64_t out = ceil_div(unit, shard);
  const dist::CommBackend backend =
      job->device == parallel::Device::CUDA ? dist::CommBackend::NCCL : dist::CommBackend::GLOO;
  return unit * rd + out * rd + dist::reduce_scatter_scratch_bytes(backend, out, shard, rd);
}

// Reduced, the output is installed as the unit's gradient shard (the parameters' dtype) beside it.
int64_t StepLayout::reduction(int64_t unit) const {
  return std::max(reduce_scatter(unit), ceil_div(unit, shard) * (rd + pe));
}

namespace {

void check_job(const TrainingJob& job, const ModelShape& shape) {
  if (job.world < 1 || job.nodes < 1 || job.world % job.nodes != 0) {
    throw std::invalid_argument("a world of " + std::to_string(job.world) + " ranks does not divide into " +
                                std::to_string(job.nodes) + " nodes (expected num_processes a multiple of nnodes)");
  }
  if (job.tp < 1 || (job.world / job.nodes) % job.tp != 0) {
    throw std::invalid_argument("tensor parallelism over " + std::to_string(job.tp) + " ranks: a node's " +
                                std::to_string(job.world / job.nodes) + " ranks do not divide into groups of it");
  }
  if (shape.tp != job.tp) {
    throw std::logic_error("the model's shape was counted at a tensor-parallel size of " + std::to_string(shape.tp) +
                           ", the job's is " + std::to_string(job.tp) + " (model_shape(recipe, job.tp))");
  }
  if (job.batch < 1) throw std::invalid_argument("batch size " + std::to_string(job.batch) + " (expected >= 1)");
  if (job.checkpoint_every < 1) {
    throw std::invalid_argument("checkpoint every " + std::to_string(job.checkpoint_every) + " layers (expected >= 1)");
  }
  if (job.grad_accum < 1) {
    throw std::invalid_argument("gradient accumulation of " + std::to_string(job.grad_accum) +
                                " micro-batches (expected >= 1)");
  }
}


// The disk tier's staging buffers (optim::DiskAdamW): its chunks are runs of a rank's parameters in order, each
// parameter's two moments padded to 4 KiB, up to 64 MiB a chunk (a larger parameter alone); two buffers of the
// largest chunk, one where a single chunk holds everything.
int64_t disk_staging_bytes(const StepLayout& s) {
  const int64_t chunk_bytes = 64LL << 20;  // optim::DiskStateOptions::chunk_bytes
  const int64_t block = io::ScratchFile::kAlignment;
  const int64_t moment_element = s.job->optimizer_state_bytes / 2;
  const std::vector<int64_t>& sizes = s.shape->trainable_in_order;
  const std::vector<char>& idle = s.shape->without_gradient_in_order;
  int64_t chunks = 0, current = 0, largest = 0;
  bool run = false;  // a chunk is open
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i < idle.size() && idle[i]) {  // not stepped this step: the run of consecutive parameters ends
      run = false;
      continue;
    }
    const int64_t bytes = 2 * ceil_div(ceil_div(sizes[i], s.shard) * moment_element, block) * block;
    if (!run || current + bytes > chunk_bytes) ++chunks, current = 0, run = true;
    current += bytes;
    largest = std::max(largest, current);
  }
  return chunks > 1 ? 2 * largest : largest;
}

// Sharded state: each unit's parameters split over the shard group (padded to a multiple of it); gradients and
// the optimizer's state for the trainable ones only (its state for every trainable parameter: the heads a step
// leaves out train in other steps).
void lay_out_sharded_state(StepLayout& s) {
  const TrainingJob& job = *s.job;
  const Units& units = s.units;
  for (size_t i = 0; i < units.numel.size(); ++i) {
    s.shard_numel += ceil_div(units.numel[i], s.shard);
    s.trainable_shard_numel += ceil_div(units.trainable[i], s.shard);
  }
  for (int64_t n : {units.extra_numel, units.input_numel, units.output_numel}) s.shard_numel += ceil_div(n, s.shard);
  for (int64_t n : {units.extra_trainable, units.input_trainable, units.output_trainable}) {
    s.trainable_shard_numel += ceil_div(n, s.shard);
  }
  s.params = s.shard_numel * s.pe, s.adam = s.trainable_shard_numel * job.optimizer_state_bytes;
  s.grads = (s.trainable_shard_numel - ceil_div(s.shape->root_without_gradient, s.shard)) * s.pe;
  s.offload = job.cpu_offload && job.strategy != parallel::Strategy::DDP;
  s.dev_params = s.offload ? 0 : s.params, s.dev_grads = s.offload ? 0 : s.grads;
  s.dev_adam = s.offload ? 0 : s.adam;
  s.adam_on_disk = s.offload && job.optimizer_on_disk;
  s.host_adam = !s.offload ? 0 : s.adam_on_disk ? disk_staging_bytes(s) : s.adam;
}

// Full parameters gathered (compute dtype). A group of one with no cast uses its parameters as they are; the root
// unit (embeddings, heads) is gathered for the loss and again at the start of backward, a layer with the next one
// prefetched; without resharding after forward every unit stays gathered until its backward is done.
// (DDP under bf16/fp16 autocast holds the same thing: the weights' compute-dtype copies, which autograd keeps for
// backward, all of them from the end of forward — but only where an op casts a weight: lookups' tables have none,
// and a tied table's head reads it through an alias, cast for the moment: tie_table(). Lookups inside layers, T5's
// position bias tables, are a few hundred elements: counted as the root's.)
void lay_out_gathered(StepLayout& s) {
  const TrainingJob& job = *s.job;
  const Units& units = s.units;
  const int64_t uncast_input = s.autocast && job.wrap != parallel::Wrap::NONE ? s.shape->input_lookup_tables : 0;
  const int64_t uncast_root = s.autocast ? s.shape->lookup_tables - uncast_input : 0;
  s.gathers = s.shard > 1 || s.ce != s.pe || s.offload;
  s.reshard = fsdp::reshards_after_forward(job.strategy);
  const int64_t ce = s.gathers ? s.ce : 0;
  // train.fp8_all_gather: a unit's float8 projections gathered in one byte an element, the rest in the compute
  // dtype (fsdp::FsdpOptions::float8_all_gather; an FSDP strategy, which the config requires).
  const int64_t f8 = job.float8_all_gather && s.gathers ? 1 : ce;
  auto gathered = [&](size_t unit) { return (units.numel[unit] - units.float8[unit]) * ce + units.float8[unit] * f8; };
  s.root_g = (s.root_unit - uncast_root) * ce - units.float8.back() * (ce - f8);
  s.layer_g = 0;
  for (size_t u = 0; u < units.numel.size(); ++u) s.unit_g.push_back(gathered(u));
  for (size_t l = 0; l + 1 < units.numel.size(); ++l) s.layer_g = std::max(s.layer_g, s.unit_g[l]);
  // The extra units are gathered only while they compute (a no-grad forward reshards at once, whatever the
  // strategy): at the start of forward (FLAVA's codebook).
  s.extra_g = units.extra_numel * ce;
  // The edge units (Llama's embedding and head): the input one gathered for its forward, the first, and again for
  // its backward, the last; the output one for the loss and its backward, the first.
  s.in_g = (units.input_numel - uncast_input) * ce, s.out_g = units.output_numel * ce;
  const int64_t float8 = std::accumulate(units.float8.begin(), units.float8.end(), int64_t{0});
  s.all_g = (s.parameters - units.extra_numel - uncast_root - uncast_input) * ce - float8 * (ce - f8);
  s.held_g = s.reshard ? s.root_g + s.out_g : s.all_g;  // gathered at the loss and as backward starts
  // Full gradients wait for their reduction in a sharded unit, or a replicated one (NO_SHARD over several ranks):
  // a layer's (in the walk), and the root's until the end of backward.
  s.replicated_fsdp = job.strategy == parallel::Strategy::NO_SHARD && job.world / job.tp > 1;
  s.reduces = (s.gathers && s.shard > 1) || s.replicated_fsdp;
  s.root_full_grads = s.reduces ? s.root_trainable * s.ce : 0;
  s.in_full_grads = s.reduces ? units.input_trainable * s.ce : 0;
}

// DDP's buckets (25 MiB of gradients each, two in flight: ddp::replicate); FSDP's reduce-scatter of a layer in
// flight while the next computes where the runtime overlaps them (fsdp::overlaps_reduce_scatter_by_default: with
// NCCL; with Gloo each reduction is waited for before the next unit's backward, its buffers gone by then).
// (With gradient_as_bucket_view the buckets are the gradients.)
void lay_out_communication(StepLayout& s) {
  const TrainingJob& job = *s.job;
  s.overlap = fsdp::overlaps_reduce_scatter_by_default(job.device == parallel::Device::CUDA ? dist::CommBackend::NCCL
                                                                                           : dist::CommBackend::GLOO);
  s.ddp_buckets = job.strategy == parallel::Strategy::DDP && job.world / job.tp > 1 && !job.gradient_as_bucket_view;
  if (s.ddp_buckets) {
    s.buckets = ddp_bucket_bytes(s.shape->trainable_in_order, s.shape->without_gradient_in_order, s.pe,
                                 static_cast<int64_t>(job.bucket_cap_mb * 1024 * 1024), s.first_blocked);
    // At the end the last two; where buckets waited for the end, they start then one after another, each once the
    // one two before it is done: the largest two neighbours.
    s.comm = ddp_in_flight(s.buckets, std::accumulate(s.buckets.begin(), s.buckets.end(), int64_t{0}),
                           s.buckets.size());
    for (size_t k = std::max<size_t>(s.first_blocked, 1); k < s.buckets.size(); ++k) {
      s.comm = std::max(s.comm, s.buckets[k - 1] + s.buckets[k]);
    }
    if (s.first_blocked < s.buckets.size()) s.comm = std::max(s.comm, s.buckets[s.first_blocked]);
  } else if (s.reduces && s.overlap) {
    s.comm = s.reduce_scatter(s.largest_layer_trainable);
  }
}

// Activations: kept from forward to backward. The every-th layers are checkpointed
// (models::activation_checkpoint_layers), keeping their input only: layer j (forward order, from 0) when every
// divides j + 1.
void lay_out_activations(StepLayout& s) {
  const TrainingJob& job = *s.job;
  s.checkpointing = job.activation_checkpointing;
  const size_t layers = s.act.layers.size();
  s.checkpoint.assign(layers, false);
  s.layer_kept.assign(layers, 0);
  for (size_t j = 0; j < layers; ++j) {
    s.checkpoint[j] = s.checkpointing && static_cast<int64_t>(j + 1) % job.checkpoint_every == 0;
    s.checkpointed += s.checkpoint[j] ? 1 : 0;
    s.layer_kept[j] = s.checkpoint[j] ? s.act.layers[j].input : s.act.layers[j].kept;
    s.kept_by_layers += s.layer_kept[j];
  }
  s.outside = s.act.kept_outside(s.checkpointed > 0);
  s.offload_activations = job.activation_offload;
  // Offloaded, the bias every layer reads goes to host memory too (once) where a layer keeps it; the device holds
  // it in forward, where the model made it, and again from the first layer's backward on: it stays in `outside`.
  if (s.offload_activations) {
    s.offloaded_activations = s.kept_by_layers + (s.outside - s.act.outside_layers);
    s.kept_by_layers = 0;
  }
  s.kept = s.kept_by_layers + s.outside;
}

// Gradient accumulation: without a reduction per micro-batch a sharded or replicated unit keeps its full gradients
// (reduce dtype) from one micro-batch to the next, every unit's by the last one; otherwise (DDP, a group of one,
// or reduced every micro-batch) the gradients themselves accumulate in .grad.
void lay_out_accumulation(StepLayout& s) {
  const TrainingJob& job = *s.job;
  const Units& units = s.units;
  int64_t trainable = units.extra_trainable + units.input_trainable + units.output_trainable;
  trainable -= s.shape->root_without_gradient;
  for (int64_t t : units.trainable) trainable += t;
  s.accumulated = job.grad_accum <= 1                                     ? 0
                  : s.reduces && !job.sync_each_batch ? trainable * s.rd  // on the device, offloaded or not
                                                      : s.dev_grads;
  s.base = s.dev_params + s.dev_adam + s.accumulated;
  const bool in_place = s.accumulated > 0 && s.accumulated == s.dev_grads;  // new gradients add into .grad
  s.new_grads = in_place ? 0 : s.dev_grads;
  // A tied table's head gradient, made first in backward, waits apart from .grad for the lookups' rows until the
  // end (tie_table()). Counted among the gradients made unless they accumulate in place (among the root's full
  // ones where reduced).
  s.tied_held = in_place && !s.reduces ? s.shape->tied_tables * s.pe : 0;
}

// A pipeline rank's part of the model's activations: the layers of its runs, and what the model keeps outside them
// (the final norm's, the loss's) only when it holds the last stage. A stage before the last holds its output for
// its backward instead (the microbatch's hidden states, the size of a layer's input), and receives its gradient.
models::ActivationBytes stage_activations(const models::ActivationBytes& whole,
                                          const std::vector<models::StageLayers>& runs) {
  models::ActivationBytes a = whole;
  a.layers.clear();
  for (const models::StageLayers& run : runs) {
    for (int64_t j = run.first; j < run.first + run.count; ++j) {
      a.layers.push_back(whole.layers.at(static_cast<size_t>(j)));
    }
  }
  const bool last = runs.back().first + runs.back().count == static_cast<int64_t>(whole.layers.size());
  if (!last) {
    const int64_t output = a.layers.back().input;
    a.outside_layers = output, a.loss_kept = 0, a.loss_transient = 0, a.backward_transient = output;
  }
  return a;
}

}  // namespace

models::ActivationQuery activation_query(const TrainingJob& job) {
  models::ActivationQuery query;
  query.batch = job.batch, query.seq_len = job.seq_len, query.device = job.device;
  query.mlm_probability = job.mlm_probability, query.mim_probability = job.mim_probability;
  query.itm_negative_probability = job.itm_negative_probability;
  query.compute = job.mixed_precision == parallel::Precision::BF16 || job.param_bytes == 2 ? at::kBFloat16
                  : job.mixed_precision == parallel::Precision::FP16                    ? at::kHalf
                                                                                        : at::kFloat;
  // DDP computes under autocast (train/parallel_model.cpp)
  query.autocast = job.strategy == parallel::Strategy::DDP && job.mixed_precision != parallel::Precision::NO;
  query.tp = job.tp, query.sequence_parallel = job.sequence_parallel && job.tp > 1;
  query.float8 = job.float8.has_value();
  return query;
}

StepLayout step_layout(const models::ModelRecipe& recipe, const ModelShape& shape, const TrainingJob& job) {
  check_job(job, shape);
  StepLayout s;
  s.job = &job, s.shape = &shape;
  const models::ActivationQuery query = activation_query(job);
  s.act = job.stages.empty() ? recipe.activation_bytes(query) : stage_activations(recipe.activation_bytes(query),
                                                                                   job.stages);
  s.autocast = query.autocast;
  s.units = units_of(shape, job.wrap);
  const Units& units = s.units;
  for (int64_t n : units.numel) s.parameters += n;
  s.parameters += units.extra_numel + units.input_numel + units.output_numel;
  s.pe = job.param_bytes, s.ce = static_cast<int64_t>(c10::elementSize(query.compute));
  s.rd = job.mixed_precision == parallel::Precision::BF16 ? 2 : 4;
  const bool replicated = job.strategy == parallel::Strategy::DDP || job.strategy == parallel::Strategy::NO_SHARD;
  const int64_t data_ranks = job.world / job.tp;
  s.shard = replicated ? 1 : parallel::is_hybrid(job.strategy) ? data_ranks / job.nodes : data_ranks;
  s.layer_units = units.numel.size() - 1;
  if (s.layer_units > 0) {
    s.largest_layer = *std::max_element(units.numel.begin(), units.numel.end() - 1);
    s.largest_layer_trainable = *std::max_element(units.trainable.begin(), units.trainable.end() - 1);
  }
  s.root_unit = units.numel.back(), s.root_trainable = units.trainable.back() - shape.root_without_gradient;
  s.root_input_side = std::min(shape.root_input_side, s.root_trainable);
  lay_out_sharded_state(s);
  lay_out_gathered(s);
  lay_out_communication(s);
  lay_out_activations(s);
  lay_out_accumulation(s);
  return s;
}

}  // namespace shardtrain::plan
