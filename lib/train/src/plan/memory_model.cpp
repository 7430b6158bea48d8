#include "shardtrain/parallel/vocabulary.h"
#include "shardtrain/plan/memory_model.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <stdexcept>

#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/models/layers.h"

namespace shardtrain::plan {

namespace {

// The units of a wrap: per transformer layer and the root (and the recipe's extra units), or everything in one
// unit.
struct Units {
  std::vector<int64_t> numel, trainable;  // per unit, the root last; trainable: gradients and AdamW state
  int64_t extra_numel = 0, extra_trainable = 0;  // the extra units together (not in numel)
  int64_t input_numel = 0, input_trainable = 0, output_numel = 0, output_trainable = 0;  // edge units (not in numel)
};

Units units_of(const ModelShape& shape, Wrap wrap) {
  Units u;
  if (wrap == Wrap::kTransformer) {
    u.numel = shape.layer_numel, u.trainable = shape.layer_trainable;
    u.numel.push_back(shape.root_numel), u.trainable.push_back(shape.root_trainable);
    u.extra_numel = shape.extra_numel, u.extra_trainable = shape.extra_trainable;
    u.input_numel = shape.input_numel, u.input_trainable = shape.input_trainable;
    u.output_numel = shape.output_numel, u.output_trainable = shape.output_trainable;
    return u;
  }
  return {{shape.parameters()}, {shape.trainable()}};
}

constexpr double kCudaAllocatorAllowance = 0.05;
// Elements of a bf16 chunk a Gloo reduce-scatter adds into its float32 accumulator at a time (dist/communicator).
constexpr int64_t kGlooHalfSlice = int64_t{1} << 20;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string mib(int64_t bytes);

std::string describe_activations(const models::ActivationBytes& a, bool checkpointed) {
  int64_t sum = 0, largest = 0;
  for (const models::LayerActivations& layer : a.layers) {
    const int64_t bytes = checkpointed ? layer.input : layer.kept;
    sum += bytes, largest = std::max(largest, bytes);
  }
  const int64_t count = static_cast<int64_t>(a.layers.size()), mean = count > 0 ? sum / count : 0;
  return std::to_string(count) + " layers x " + mib(mean) + (largest > mean ? " on average" : "") +
         (checkpointed ? " (checkpointed: inputs only)" : "") + " + " + mib(a.kept_outside(checkpointed)) +
         " outside them";
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

// DDP's buckets (ddp::replicate): the trainable tensors in reverse registration order (backward's), a bucket closed
// once it holds `cap` bytes or more — so one may hold up to cap plus a tensor. Bytes per bucket, in launch order.
// `first_blocked`: the first bucket holding a parameter the step gives no gradient (without_gradient, parallel to
// numel_in_order), ready only at the end of backward (ddp::replicate's finish_backward); buckets.size() if none.
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

// Bytes of DDP's buckets in flight once `done` bytes of gradients are made: the last two complete (two at most
// are all-reduced at once; an earlier one is waited for, and its copy dropped, when a third starts). They start in
// order: none from the first blocked one on (ddp_bucket_bytes) before the end of backward.
int64_t ddp_in_flight(const std::vector<int64_t>& buckets, int64_t done, size_t first_blocked) {
  size_t complete = 0;
  for (int64_t sum = 0; complete < first_blocked && sum + buckets[complete] <= done; ++complete) {
    sum += buckets[complete];
  }
  int64_t bytes = 0;
  for (size_t k = complete >= 2 ? complete - 2 : 0; k < complete; ++k) bytes += buckets[k];
  return bytes;
}

}  // namespace

int64_t ModelShape::parameters() const {
  int64_t n = root_numel + extra_numel + input_numel + output_numel;
  for (int64_t l : layer_numel) n += l;
  return n;
}

int64_t ModelShape::trainable() const {
  int64_t n = root_trainable + extra_trainable + input_trainable + output_trainable;
  for (int64_t t : layer_trainable) n += t;
  return n;
}

namespace {

using TensorSet = std::set<const c10::TensorImpl*>;

// Calls f on each parameter of `m` not in `seen` yet, noting it there: a tied tensor once.
template <class F>
void each_new_parameter(const torch::nn::Module& m, TensorSet& seen, F f) {
  for (const auto& p : m.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) f(p);
  }
}

}  // namespace

// Tied tensors count once, in the first unit that holds them.
ModelShape model_shape(const models::ModelRecipe& recipe) {
  const auto root = recipe.build(models::meta_build());
  TensorSet seen;
  ModelShape shape;
  auto count = [&](const torch::nn::Module& m, int64_t& all, int64_t& trainable) {
    each_new_parameter(m, seen, [&](const at::Tensor& p) {
      all += p.numel();
      if (p.requires_grad()) {
        trainable += p.numel();
        shape.largest_trainable_tensor = std::max(shape.largest_trainable_tensor, p.numel());
      }
    });
  };
  TensorSet listed;
  std::vector<const c10::TensorImpl*> trainable_order;
  each_new_parameter(*root, listed, [&](const at::Tensor& p) {
    if (!p.requires_grad()) return;
    shape.trainable_in_order.push_back(p.numel());
    trainable_order.push_back(p.unsafeGetTensorImpl());
  });
  const std::vector<std::string> extra = recipe.extra_unit_classes();
  const models::ModelRecipe::EdgeUnits edges = recipe.edge_unit_classes();
  const c10::TensorImpl* first_layer = nullptr;  // the first layer's first parameter
  for (const auto& m : root->modules(/*include_self=*/false)) {
    const std::string name = fsdp::module_class_name(*m);
    if (std::find(extra.begin(), extra.end(), name) != extra.end()) {
      count(*m, shape.extra_numel, shape.extra_trainable);
      continue;
    }
    if (!edges.input.empty() && name == edges.input) {
      count(*m, shape.input_numel, shape.input_trainable);
      continue;
    }
    if (!edges.output.empty() && name == edges.output) {
      count(*m, shape.output_numel, shape.output_trainable);
      continue;
    }
    if (name != recipe.layer_class()) continue;
    shape.layer_numel.push_back(0), shape.layer_trainable.push_back(0);
    count(*m, shape.layer_numel.back(), shape.layer_trainable.back());
    if (first_layer == nullptr && !m->parameters().empty()) first_layer = m->parameters().front().unsafeGetTensorImpl();
  }
  // The root's own trainable parameters registered before the first layer's, its input side, but for the tables a
  // head shares (its gradient comes first).
  TensorSet tied;
  const auto named = root->named_parameters(/*recurse=*/true);
  for (const std::string& name : recipe.tied_tables()) {
    const at::Tensor* table = named.find(name);
    if (table == nullptr) {
      throw std::logic_error(recipe.flavor() + ": tied table '" + name + "' is not one of the model's parameters");
    }
    if (table->requires_grad() && tied.insert(table->unsafeGetTensorImpl()).second) shape.tied_tables += table->numel();
  }
  TensorSet input_side = tied;  // each tensor once (a tensor read twice is listed twice), the tied tables never
  for (const at::Tensor& p : root->parameters(/*recurse=*/true)) {
    const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    if (impl == first_layer) break;
    if (p.requires_grad() && seen.count(impl) == 0 && input_side.insert(impl).second) {
      shape.root_input_side += p.numel();
    }
  }
  count(*root, shape.root_numel, shape.root_trainable);
  // The modules the task's largest step leaves out, as far as the root holds them.
  const std::vector<std::string> left_out = recipe.task()->modules_without_gradient();
  TensorSet left_out_seen;
  for (const auto& item : root->named_modules()) {
    if (std::find(left_out.begin(), left_out.end(), item.key()) == left_out.end()) continue;
    each_new_parameter(*item.value(), left_out_seen, [&](const at::Tensor& p) {
      if (p.requires_grad()) shape.root_without_gradient += p.numel();
    });
  }
  shape.root_without_gradient = std::min(shape.root_without_gradient, shape.root_trainable);
  for (const c10::TensorImpl* p : trainable_order) shape.without_gradient_in_order.push_back(left_out_seen.count(p));
  TensorSet lookups_seen;
  for (const auto& m : root->modules(/*include_self=*/false)) {
    if (dynamic_cast<const models::LookupModule*>(m.get()) == nullptr) continue;
    const bool input = !edges.input.empty() && fsdp::module_class_name(*m) == edges.input;
    each_new_parameter(*m, lookups_seen, [&](const at::Tensor& p) {
      shape.lookup_tables += p.numel();
      if (input) shape.input_lookup_tables += p.numel();
    });
  }
  return shape;
}

Wrap parse_wrap(const std::string& name) {
  if (name == "transformer") return Wrap::kTransformer;
  if (name == "none") return Wrap::kNone;
  throw std::invalid_argument("unknown wrap '" + name + "' (expected transformer or none)");
}

std::string wrap_name(Wrap w) { return w == Wrap::kTransformer ? "transformer" : "none"; }

MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const TrainingJob& job) {
  return estimate_training_memory(recipe, model_shape(recipe), job);
}

MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const ModelShape& shape,
                                        const TrainingJob& job) {
  if (job.world < 1 || job.nodes < 1 || job.world % job.nodes != 0) {
    throw std::invalid_argument("a world of " + std::to_string(job.world) + " ranks does not divide into " +
                                std::to_string(job.nodes) + " nodes (expected num_processes a multiple of nnodes)");
  }
  if (job.batch < 1) throw std::invalid_argument("batch size " + std::to_string(job.batch) + " (expected >= 1)");
  models::ActivationQuery query;
  query.batch = job.batch, query.seq_len = job.seq_len, query.cuda = job.device == parallel::Device::CUDA;
  query.mlm_probability = job.mlm_probability, query.mim_probability = job.mim_probability;
  query.itm_negative_probability = job.itm_negative_probability;
  query.compute = job.mixed_precision == parallel::Precision::BF16 || job.param_bytes == 2 ? at::kBFloat16
                  : job.mixed_precision == parallel::Precision::FP16                    ? at::kHalf
                                                                     : at::kFloat;
  query.autocast = job.strategy == parallel::Strategy::DDP && job.mixed_precision != parallel::Precision::NO;  // train/parallel_model.cpp
  const models::ActivationBytes act = recipe.activation_bytes(query);

  MemoryEstimate e;
  e.tokens = job.seq_len > 0 ? job.seq_len : recipe.task()->data_needs().max_text_length;
  const Units units = units_of(shape, job.wrap);
  for (int64_t n : units.numel) e.parameters += n;
  e.parameters += units.extra_numel + units.input_numel + units.output_numel;
  e.units = static_cast<int64_t>(units.numel.size()) + (units.extra_numel > 0 ? 1 : 0) +
            (units.input_numel > 0 ? 1 : 0) + (units.output_numel > 0 ? 1 : 0);
  const int64_t pe = job.param_bytes, ce = static_cast<int64_t>(c10::elementSize(query.compute));
  const bool hybrid = job.strategy == parallel::Strategy::HYBRID_SHARD || job.strategy == parallel::Strategy::HYBRID_SHARD_ZERO2;
  const bool replicated = job.strategy == parallel::Strategy::DDP || job.strategy == parallel::Strategy::NO_SHARD;
  // Ranks a parameter is sharded over: the node for hybrid strategies, everyone for the others, one when replicated.
  const int64_t shard = replicated ? 1 : hybrid ? job.world / job.nodes : job.world;
  const bool mixed = ce != pe;
  const size_t layer_units = units.numel.size() - 1;
  const int64_t largest_layer =
      layer_units > 0 ? *std::max_element(units.numel.begin(), units.numel.end() - 1) : 0;
  const int64_t largest_layer_trainable =
      layer_units > 0 ? *std::max_element(units.trainable.begin(), units.trainable.end() - 1) : 0;
  // The root's trainable parameters that get a gradient in the step walked (its unused heads get none).
  const int64_t root_unit = units.numel.back(), root_trainable = units.trainable.back() - shape.root_without_gradient;
  const int64_t root_input_side = std::min(shape.root_input_side, root_trainable);

  // Sharded state: each unit's parameters split over the shard group (padded to a multiple of it); gradients and
  // AdamW's two moments for the trainable ones only.
  int64_t shard_numel = 0, trainable_shard_numel = 0;
  for (size_t i = 0; i < units.numel.size(); ++i) {
    shard_numel += ceil_div(units.numel[i], shard);
    trainable_shard_numel += ceil_div(units.trainable[i], shard);
  }
  for (int64_t n : {units.extra_numel, units.input_numel, units.output_numel}) shard_numel += ceil_div(n, shard);
  for (int64_t n : {units.extra_trainable, units.input_trainable, units.output_trainable}) {
    trainable_shard_numel += ceil_div(n, shard);
  }
  // AdamW holds state for every trainable parameter (the heads a step leaves out train in other steps).
  const int64_t params = shard_numel * pe, adam = trainable_shard_numel * job.optimizer_state_bytes;
  const int64_t grads = (trainable_shard_numel - ceil_div(shape.root_without_gradient, shard)) * pe;
  const bool offload = job.cpu_offload && job.strategy != parallel::Strategy::DDP;
  if (offload) e.host_bytes = params + grads + adam;
  const int64_t dev_params = offload ? 0 : params, dev_grads = offload ? 0 : grads, dev_adam = offload ? 0 : adam;

  // Full parameters gathered (compute dtype). A group of one with no cast uses its parameters as they are; the
  // root unit (embeddings, heads) is gathered for the loss and again at the start of backward, a layer with the
  // next one prefetched; without resharding after forward every unit stays gathered until its backward is done.
  // (DDP under bf16/fp16 autocast holds the same thing: the weights' compute-dtype copies, which autograd keeps for
  // backward, all of them from the end of forward — but only where an op casts a weight: lookups' tables have none,
  // and a tied table's head reads it through an alias, cast for the moment: tie_table(). Lookups inside layers,
  // T5's position bias tables, are a few hundred elements: counted as the root's.)
  const int64_t uncast_input = query.autocast && job.wrap != Wrap::kNone ? shape.input_lookup_tables : 0;
  const int64_t uncast_root = query.autocast ? shape.lookup_tables - uncast_input : 0;
  const bool gathers = shard > 1 || mixed || offload;
  const bool reshard = job.strategy == parallel::Strategy::FULL_SHARD || job.strategy == parallel::Strategy::HYBRID_SHARD;
  const int64_t root_g = gathers ? (root_unit - uncast_root) * ce : 0, layer_g = gathers ? largest_layer * ce : 0;
  // The extra units are gathered only while they compute (a no-grad forward reshards at once, whatever the
  // strategy): at the start of forward (FLAVA's codebook).
  const int64_t extra_g = gathers ? units.extra_numel * ce : 0;
  // The edge units (Llama's embedding and head): the input one gathered for its forward, the first, and again
  // for its backward, the last; the output one for the loss and its backward, the first.
  const int64_t in_g = gathers ? (units.input_numel - uncast_input) * ce : 0;
  const int64_t out_g = gathers ? units.output_numel * ce : 0;
  const int64_t all_g = gathers ? (e.parameters - units.extra_numel - uncast_root - uncast_input) * ce : 0;
  const int64_t held_g = reshard ? root_g + out_g : all_g;  // gathered at the loss and as backward starts
  // Full gradients wait for their reduction in a sharded unit, or a replicated one (NO_SHARD over several ranks):
  // a layer's (in the walk), and the root's until the end of backward.
  const bool replicated_fsdp = job.strategy == parallel::Strategy::NO_SHARD && job.world > 1;
  const bool reduces = (gathers && shard > 1) || replicated_fsdp;
  const int64_t root_full_grads = reduces ? root_trainable * ce : 0;
  const int64_t in_full_grads = reduces ? units.input_trainable * ce : 0;
  // A reduce-scatter holds its flat input (the unit's trainable parameters, in the reduce dtype: bf16 reduces in
  // bf16, fp16 in float32) and the output shard; on Gloo (NCCL has none) two receive buffers of one shard each
  // (one with a single peer) and for bf16 a float32 accumulator of one shard (the sum is rounded once) and the
  // float32 copy of the slice being added into it.
  // A replicated unit (NO_SHARD) all-reduces its flat buffer in place.
  const int64_t rd = job.mixed_precision == parallel::Precision::BF16 ? 2 : 4;
  auto reduce_scatter = [&](int64_t unit) {
    if (replicated_fsdp) return unit * rd;
    const int64_t out = ceil_div(unit, shard);
    const int64_t received = job.device == parallel::Device::CUDA ? 0 : std::min<int64_t>(2, shard - 1) * out * rd;
    const int64_t accumulator =
        rd == 2 && job.device != parallel::Device::CUDA ? (out + std::min<int64_t>(out, kGlooHalfSlice)) * 4 : 0;
    return unit * rd + out * rd + received + accumulator;
  };
  // Reduced, the output is installed as the unit's gradient shard (the parameters' dtype) beside it: the collective
  // or that, whichever holds more.
  auto reduction = [&](int64_t unit) { return std::max(reduce_scatter(unit), ceil_div(unit, shard) * (rd + pe)); };
  // DDP's buckets (25 MiB of gradients each, two in flight: ddp::replicate); FSDP's reduce-scatter of a layer in
  // flight while the next computes — on CUDA only: with Gloo each reduction is waited for before the next unit's
  // backward (FsdpOptions::overlap_reduce_scatter), its buffers gone by then.
  const bool overlap = job.device == parallel::Device::CUDA;
  // (With gradient_as_bucket_view the buckets are the gradients.)
  const bool ddp_buckets = job.strategy == parallel::Strategy::DDP && job.world > 1 && !job.gradient_as_bucket_view;
  size_t first_blocked = 0;
  const std::vector<int64_t> buckets =
      ddp_buckets ? ddp_bucket_bytes(shape.trainable_in_order, shape.without_gradient_in_order, pe,
                                     static_cast<int64_t>(job.bucket_cap_mb * 1024 * 1024), first_blocked)
                  : std::vector<int64_t>{};
  int64_t comm = 0;
  if (ddp_buckets) {
    // At the end the last two; where buckets waited for the end, they start then one after another, each once the
    // one two before it is done: the largest two neighbours.
    comm = ddp_in_flight(buckets, std::accumulate(buckets.begin(), buckets.end(), int64_t{0}), buckets.size());
    for (size_t k = std::max<size_t>(first_blocked, 1); k < buckets.size(); ++k) {
      comm = std::max(comm, buckets[k - 1] + buckets[k]);
    }
    if (first_blocked < buckets.size()) comm = std::max(comm, buckets[first_blocked]);
  } else if (reduces && overlap) {
    comm = reduce_scatter(largest_layer_trainable);
  }

  // Activations: kept from forward to backward, the loss's logits on top at the end of forward, its gradients on
  // top at the start of backward; then each layer's activations are freed as its gradients arrive.
  const bool ac = job.activation_checkpointing;
  if (job.checkpoint_every < 1) {
    throw std::invalid_argument("checkpoint every " + std::to_string(job.checkpoint_every) + " layers (expected >= 1)");
  }
  // The every-th layers are checkpointed (models::activation_checkpoint_layers), keeping their input only: layer j
  // (forward order, from 0) when every divides j + 1.
  const int64_t layers = static_cast<int64_t>(act.layers.size());
  std::vector<bool> checkpoint(act.layers.size());
  std::vector<int64_t> layer_kept(act.layers.size());  // what each layer keeps from its forward to its backward
  int64_t checkpointed = 0, kept_by_layers = 0;
  for (int64_t j = 0; j < layers; ++j) {
    checkpoint[j] = ac && (j + 1) % job.checkpoint_every == 0;
    checkpointed += checkpoint[j] ? 1 : 0;
    layer_kept[j] = checkpoint[j] ? act.layers[j].input : act.layers[j].kept;
    kept_by_layers += layer_kept[j];
  }
  const int64_t outside = act.kept_outside(checkpointed > 0);
  const int64_t kept = kept_by_layers + outside;

  // Gradient accumulation: without a reduction per micro-batch a sharded or replicated unit keeps its full gradients
  // (reduce dtype) from one micro-batch to the next, every unit's by the last one.
  if (job.grad_accum < 1) {
    throw std::invalid_argument("gradient accumulation of " + std::to_string(job.grad_accum) +
                                " micro-batches (expected >= 1)");
  }
  int64_t trainable = units.extra_trainable + units.input_trainable + units.output_trainable;
  trainable -= shape.root_without_gradient;
  for (int64_t t : units.trainable) trainable += t;
  // Otherwise (DDP, a group of one, or reduced every micro-batch) the gradients themselves accumulate in .grad.
  const int64_t accumulated = job.grad_accum <= 1                        ? 0
                              : reduces && !job.sync_each_batch && !offload ? trainable * rd
                                                                          : dev_grads;
  const int64_t base = dev_params + dev_adam + accumulated;
  const bool in_place = accumulated > 0 && accumulated == dev_grads;  // new gradients add into .grad: counted once
  const int64_t new_grads = in_place ? 0 : dev_grads;
  // A tied table's head gradient, made first in backward, waits apart from .grad for the lookups' rows until the
  // end (tie_table()). Counted among the gradients made unless they accumulate in place (among the root's full ones
  // where reduced).
  const int64_t tied_held = in_place && !reduces ? shape.tied_tables * pe : 0;
  // Gathering a unit holds it twice for a moment: the all-gather's flat output and the parameters copied out of it.
  // The root first; then, before any layer, what the model computes first (FLAVA: its extra unit, the codebook,
  // gathered and tokenizing).
  // (Autocast gathers nothing: its copies are made as the ops run, none yet.)
  const int64_t forward_start =
      query.autocast ? act.start_transient
                     : std::max({2 * root_g, root_g + 2 * extra_g, root_g + extra_g + act.start_transient,
                                 root_g + 2 * in_g});
  const int64_t forward_loss = held_g + kept + act.loss_transient;
  // The layers computing, before the loss keeps anything; a checkpointed layer computes its forward without keeping
  // anything, its temporaries on top while it runs.
  const int64_t forward_gathered = reshard ? root_g + 2 * layer_g : all_g - out_g;
  const int64_t forward_work = checkpointed > 0 ? act.layer_forward_transient : 0;
  const int64_t forward_layers = forward_gathered + kept - act.loss_kept + forward_work;
  e.forward_bytes = base + std::max({forward_start, forward_loss, forward_layers});

  // Backward starts with the root still gathered from its forward (the root is never resharded between its forward
  // and the backward that follows), the loss's gradients arriving with the last layer prefetched.
  const int64_t prefetched = reshard ? layer_g : 0;
  // An output edge unit resharded after the loss is gathered again as backward starts, and held twice for a moment
  // (the all-gather's output and the parameters copied out of it) before the last layer's prefetch is issued.
  const int64_t regather = reshard ? out_g : 0;
  const int64_t backward_start = kept + held_g + std::max(prefetched, regather) + act.backward_transient;
  // An output edge unit reduces its gradients first (the head's, which the loss keeps from forward): resharded, its
  // gradients copied into the reduction's input, then the reduction while the activations below wait.
  const int64_t head_others = reshard ? root_g + prefetched : all_g - out_g;  // gathered meanwhile
  int64_t head_reduction = 0;
  if (reduces && units.output_trainable > 0) {
    head_reduction = std::max(head_others + kept + units.output_trainable * rd,
                              head_others + kept - act.loss_kept + reduce_scatter(units.output_trainable));
  }
  // Layer i (1 = the last) computing its backward: the layers below it still keep their activations, those above
  // have handed in their gradients.
  int64_t backward_walk = 0, walk_gathered = 0, walk_in_flight = 0, walk_layer_grads = 0, walk_root_grads = 0;
  int64_t walk_work = 0;
  int64_t waiting_now = 0, walk_waiting = 0;  // of the layer gradients, the partial ones of layers run twice
  auto candidate = [&](int64_t at, int64_t gathered, int64_t in_flight, int64_t layer_grads, int64_t root_grads,
                       int64_t work) {
    if (at <= backward_walk) return;
    backward_walk = at, walk_gathered = gathered, walk_in_flight = in_flight, walk_layer_grads = layer_grads;
    walk_root_grads = root_grads, walk_work = work, walk_waiting = waiting_now;
  };
  // Layer i of the walk (1 = the last): its own unit's parameters where each layer is one, in registration order
  // (T5's decoder layers, with cross-attention, are a third larger than its encoder's), else the largest.
  const bool own_units = job.wrap != Wrap::kNone && layer_units == act.layers.size();
  auto walk_unit = [&](const std::vector<int64_t>& per_unit, int64_t largest, int64_t i) {
    return own_units ? per_unit[static_cast<size_t>(layers - std::min(i, layers))] : largest;
  };
  auto walk_numel = [&](int64_t i) { return walk_unit(units.numel, largest_layer, i); };
  const std::vector<models::BackwardMoment> every_gradient_at_once = {{0, -1}};  // a layer stating no moments
  int64_t above_numel = 0;  // the parameters of the layers done (their units complete)
  int64_t grad_shards = 0;  // the gradient elements the layers walked have made (a layer run twice: once)
  int64_t below_kept = kept_by_layers;  // what the layers not done yet keep, this one's included
  // [Parameters run twice] A layer's second run (LayerActivations::ran_before) is walked first: its unit's gradients
  // wait, partial, in autograd's buffers — no reduction, no DDP bucket — until its first run's backward adds into
  // them and completes them (its AccumulateGrad runs once, then). Meanwhile the unit is resharded, and gathered
  // again for its first run's backward (fully_shard: [Note: a unit called twice]). The units waiting, in the order
  // they complete (the last layer's second run pairs with its first).
  std::deque<int64_t> waiting;
  int64_t waiting_numel = 0;
  const bool pairs = job.wrap != Wrap::kNone;  // (one unit for the whole model: gathered, its gradients growing)
  for (int64_t i = 1; i <= layers; ++i) {
    const models::LayerActivations& layer = act.layers[layers - i];
    below_kept -= layer_kept[layers - i];
    const bool runs_again = pairs && layer.runs_again, ran_before = pairs && layer.ran_before;
    const int64_t layer_i = gathers ? walk_numel(i) * ce : 0;
    const int64_t waiting_grads = reduces ? waiting_numel * ce : 0;
    waiting_now = waiting_grads;
    // Gradients not reduced unit by unit (one rank, DDP) are .grad from the moment they are made: the head's (the
    // root's and an output edge unit's) first, then the layers' done. (One unit for the whole model: they grow
    // layer by layer.)
    // (The root's parameters that compute before the layers, its embeddings', get theirs at the end.)
    const int64_t unreduced_head =
        reduces ? 0
        : job.wrap == Wrap::kNone ? new_grads * (i - 1) / layers
                                  : (root_trainable - root_input_side + units.output_trainable) * pe;
    const int64_t done = grad_shards * pe + unreduced_head;
    // Without resharding after forward every layer is still gathered until its own backward is done (the output
    // edge unit resharded after its own, the input one gathered to the end), a layer run twice until its second
    // run's: its first run's gathers it again, and the one before prefetches it. The first layer prefetches the
    // input edge unit where there is one.
    const int64_t next = i < layers || in_g == 0 ? (gathers ? walk_numel(i + 1) * ce : 0) : in_g;
    const int64_t next_again = i < layers && pairs && act.layers[layers - i - 1].runs_again ? next : 0;
    const int64_t above_g = gathers ? above_numel * ce : 0, waiting_g = gathers ? waiting_numel * ce : 0;
    const int64_t gathered =
        reshard ? root_g + layer_i + next
                : std::max<int64_t>(all_g - out_g - above_g - waiting_g + (runs_again ? layer_i : 0) + next_again,
                                    root_g + in_g);
    // One unit for the whole model: its full gradients grow layer by layer; else the root's (heads) are there first.
    const int64_t root_grads_at_i = job.wrap == Wrap::kNone
                                        ? root_full_grads * (i - 1) / layers
                                        : root_full_grads - (reduces ? root_input_side * ce : 0);
    const int64_t below = below_kept + outside - act.loss_kept;
    // A checkpointed layer replays its forward from its kept input (the same tensor: not counted twice).
    const int64_t own = layer_kept[layers - i], replay = checkpoint[layers - i] ? layer.kept - layer.input : 0;
    // The layer's backward, moment by moment (walked from the last layer): its MLP's, whose output projection's
    // gradient is made first, then attention's, with all of them. Reduced, they are full gradients in the compute
    // dtype until the layer's reduction; else .grad from the start.
    for (const models::BackwardMoment& moment : layer.backward.empty() ? every_gradient_at_once : layer.backward) {
      const int64_t made = moment.gradient_elements < 0 ? walk_numel(i)
                                                        : std::min(moment.gradient_elements, walk_numel(i));
      const int64_t layer_full_grads = (reduces ? made * ce : 0) + waiting_grads;
      const int64_t done_now = done + (reduces ? 0 : made * pe);
      const int64_t grads_so_far = std::min(done_now, new_grads);  // those accumulated in place are in `base`
      // The reduction in flight is the layer above's: none while the last layer computes. DDP's: the buckets its
      // gradients so far have filled, two at most (a tied table's is ready only at the end, whatever it holds;
      // a unit run twice only once both runs' are in).
      const int64_t unready = waiting_numel + (ran_before || runs_again ? made : 0);
      const int64_t ready = std::max<int64_t>(0, done_now - shape.tied_tables * pe - (reduces ? 0 : unready * pe));
      const int64_t in_flight = ddp_buckets ? ddp_in_flight(buckets, ready, first_blocked)
                                : i > 1     ? comm
                                            : 0;
      candidate(gathered + in_flight + layer_full_grads + root_grads_at_i + below + own + replay + moment.transient +
                    grads_so_far + tied_held,
                gathered, in_flight, layer_full_grads, root_grads_at_i, std::max<int64_t>(0, moment.transient));
    }
    if (!runs_again) grad_shards += ceil_div(walk_numel(i), shard);
    if (runs_again) e.parameters_called_twice += walk_numel(i);
    if (ran_before) {  // waits for its first run: no reduction yet
      waiting.push_back(walk_numel(i)), waiting_numel += walk_numel(i);
      continue;
    }
    if (runs_again && !waiting.empty()) waiting_numel -= waiting.front(), waiting.pop_front();
    above_numel += walk_numel(i);
    const int64_t grads_so_far = std::min(done, new_grads);
    // The layer's reduction: its full gradients copied into the flat input, all of them alive while that is
    // allocated (each is dropped once copied), the layer resharded and the next layer's gather issued. Waited for at
    // once (Gloo), the reduction is a moment of its own: input, output and receive buffers (on the CPU, bf16's
    // float32 sum is the most).
    if (reduces && job.wrap != Wrap::kNone) {
      // The units still waiting for their first runs hold their partial gradients, resharded.
      const int64_t waiting_full = waiting_numel * ce;
      waiting_now = waiting_full;
      const int64_t rs_gathered =
          reshard ? root_g + next
                  : std::max<int64_t>(all_g - out_g - above_g - (gathers ? (walk_numel(i) + waiting_numel) * ce : 0) +
                                          next_again,
                                      root_g + in_g);
      const int64_t trainable_i = walk_unit(units.trainable, largest_layer_trainable, i);
      const int64_t rest = rs_gathered + waiting_full + root_grads_at_i + below + grads_so_far + tied_held;
      candidate(rest + trainable_i * rd + trainable_i * ce, rs_gathered, trainable_i * rd,
                trainable_i * ce + waiting_full, root_grads_at_i, 0);
      if (!overlap) {
        candidate(rest + reduction(trainable_i), rs_gathered, reduction(trainable_i), waiting_full, root_grads_at_i, 0);
      }
    }
  }
  // The end: the root's gradients complete (a tied table's lookups add their rows into its head's gradient in
  // place: tie_table()), with an input edge unit's, which reduces first; then, sharded, the root's reduce-scatter
  // once its full parameters are dropped. (Every layer has been resharded after its backward by then: only the root
  // and the input unit are gathered.) (With overlap the last layer's reduction is still in flight while the root
  // computes; DDP's buckets are all there as the last ones all-reduce.)
  const int64_t end_gradients = root_g + in_g + new_grads + root_full_grads + in_full_grads + tied_held + comm;
  // (Each reduction's input is allocated with the unit's full gradients still alive, as a layer's; the gradient
  // shards of the units reducing last are not there yet.)
  const int64_t root_shard_grads = new_grads > 0 ? ceil_div(root_trainable, shard) * pe : 0;
  const int64_t in_shard_grads = new_grads > 0 ? ceil_div(units.input_trainable, shard) * pe : 0;
  auto end_reduction = [&](int64_t trainable, int64_t full_grads) {
    return std::max(full_grads + trainable * rd, reduction(trainable));
  };
  const int64_t end_input_reduction =
      reduces ? new_grads - root_shard_grads - in_shard_grads + root_full_grads +
                    end_reduction(units.input_trainable, in_full_grads)
              : 0;
  const int64_t end_root_reduction =
      reduces ? new_grads - root_shard_grads + end_reduction(root_trainable, root_full_grads) : 0;
  // An input edge unit resharded after its forward is gathered again for its backward (held twice for a moment).
  const int64_t end_input_gather = reshard ? root_g + 2 * in_g + new_grads + root_full_grads : 0;
  const int64_t backward_end = std::max({end_gradients, end_input_reduction, end_root_reduction, end_input_gather});
  const int64_t backward_peak = std::max({backward_start, head_reduction, backward_walk, backward_end});
  e.backward_bytes = base + backward_peak;

  // The step: clipping sums squares in float64 (FSDP: a float64 copy of a gradient and its square, the largest
  // shard's; DDP's clip_grad_norm_ takes norms without copies), then AdamW a parameter at a time (sqrt(v) and its
  // quotient by the bias correction, two temporaries of the largest tensor).
  // (Per-parameter shards: a parameter's rows split over the group, whatever the wrap.)
  const int64_t largest_shard = ceil_div(shape.largest_trainable_tensor, shard);
  const int64_t clip_temp = job.strategy == parallel::Strategy::DDP || offload ? 0 : 2 * largest_shard * 8;
  const int64_t adam_temp = offload || job.fused_optimizer ? 0 : 2 * largest_shard * pe;
  e.step_bytes = dev_params + dev_adam + dev_grads + std::max(clip_temp, adam_temp);  // accumulation is over
  e.peak_phase = std::max({e.forward_bytes, e.backward_bytes, e.step_bytes}) == e.backward_bytes ? "backward"
                 : std::max(e.forward_bytes, e.step_bytes) == e.forward_bytes                  ? "forward"
                                                                                               : "step";
  // The CUDA caching allocator rounds every block up and keeps freed blocks of other sizes apart: what it holds
  // runs above what tensors asked for. (The CPU count is of what tensors asked for.)
  const auto allowance = [&](int64_t bytes) {
    return job.device == parallel::Device::CUDA ? static_cast<int64_t>(static_cast<double>(bytes) * kCudaAllocatorAllowance) : 0;
  };
  const int64_t phase_allowance = allowance(std::max({e.forward_bytes, e.backward_bytes, e.step_bytes}));
  e.forward_bytes += allowance(e.forward_bytes), e.backward_bytes += allowance(e.backward_bytes);
  e.step_bytes += allowance(e.step_bytes);
  e.peak_bytes = std::max({e.forward_bytes, e.backward_bytes, e.step_bytes});

  if (phase_allowance > 0) {
    e.terms.push_back({"CUDA allocator allowance", phase_allowance,
                       "block rounding and fragmentation, " +
                           std::to_string(static_cast<int>(kCudaAllocatorAllowance * 100)) + "% of the rest"});
  }
  const std::string per = shard > 1 ? " / " + std::to_string(shard) + " ranks" : "";
  const std::string per_param = std::to_string(pe) + " B per trainable parameter" + per;
  e.terms.push_back({"parameters", dev_params,
                     std::to_string(shard_numel) + " elements x " + std::to_string(pe) + " B" + per +
                         (offload ? " (offloaded: host)" : "")});
  e.terms.push_back({job.optimizer + " state", dev_adam,
                     std::to_string(job.optimizer_state_bytes) + " B per trainable parameter" + per});
  if (accumulated > 0 && e.peak_phase != "step") {
    e.terms.push_back({"accumulated gradients", accumulated,
                       accumulated == dev_grads ? "kept between micro-batches in .grad"
                                                : "every unit's full ones, kept between micro-batches "
                                                  "(train.sync_each_batch: sharded ones only)"});
  }
  if (e.peak_phase == "step") {
    e.terms.push_back({"gradients", dev_grads, std::to_string(pe) + " B per parameter" + per});
    e.terms.push_back({"clipping and AdamW temporaries", std::max(clip_temp, adam_temp),
                       "of the largest tensor: float64 copies to clip, or AdamW's sqrt(v) and quotient"});
    return e;
  }
  if (e.peak_phase == "forward" && forward_start >= std::max(forward_loss, forward_layers)) {
    if (query.autocast) {
      e.terms.push_back({"start of forward", act.start_transient, "what the model computes first (FLAVA: the "
                                                                  "codebook making MIM targets)"});
    } else if (forward_start == 2 * root_g) {
      e.terms.push_back({"gathered parameters", forward_start, "the root unit, being gathered (held twice)"});
    } else if (forward_start == root_g + 2 * in_g) {
      e.terms.push_back({"gathered parameters", forward_start, "the root unit, and the input edge unit (the "
                                                               "embedding) being gathered (held twice)"});
    } else if (forward_start == root_g + 2 * extra_g) {
      e.terms.push_back({"gathered parameters", forward_start, "the root unit, and the extra units being gathered "
                                                               "(held twice)"});
    } else {
      e.terms.push_back({"gathered parameters", root_g + extra_g, "the root unit and the extra units"});
      e.terms.push_back({"start of forward", act.start_transient, "what the model computes first (FLAVA: the "
                                                                  "codebook making MIM targets)"});
    }
    return e;
  }
  if (e.peak_phase == "forward") {
    const bool at_loss = forward_loss >= forward_layers;
    e.terms.push_back({"gathered parameters", at_loss ? held_g : forward_gathered,
                       !gathers ? "none: a group of one holds its parameters"
                       : !reshard ? "every unit, gathered until its backward"
                       : at_loss  ? (out_g > 0 ? "the root unit and the head's" : "the root unit (embeddings, heads)")
                                  : "the root unit and a layer with the next prefetched"});
    if (at_loss) {
      e.terms.push_back({"activations", kept, describe_activations(act, ac)});
      e.terms.push_back({"end of forward", act.loss_transient, "the loss's logits and their copies"});
    } else {
      e.terms.push_back({"activations", kept - act.loss_kept, describe_activations(act, ac) + ", less the loss's"});
      if (forward_work > 0) {
        e.terms.push_back({"layer temporaries", forward_work, "a checkpointed layer computing (attention, MLP)"});
      }
    }
    return e;
  }
  const std::string where = backward_peak == backward_start   ? "start"
                            : backward_peak == head_reduction ? "head"
                            : backward_peak == backward_walk  ? "layers"
                                                              : "end";
  if (where == "start") {
    e.terms.push_back({"gathered parameters", held_g + std::max(prefetched, regather),
                       !gathers                 ? "none: a group of one holds its parameters"
                       : !reshard               ? "every unit, gathered since forward"
                       : regather > prefetched ? "the root unit, and the head's being gathered again (held twice)"
                                                : "the root unit (and the head's), and the last layer prefetched"});
    e.terms.push_back({"activations", kept, describe_activations(act, ac)});
    e.terms.push_back({"loss gradients", act.backward_transient, "log-softmax's result's gradient and the logits'"});
  } else if (where == "head") {
    e.terms.push_back({"gathered parameters", head_others,
                       reshard ? "the root unit, and the last layer prefetched" : "every unit but the head's"});
    e.terms.push_back({"head reduce-scatter", head_reduction - head_others - kept + act.loss_kept,
                       "the head's gradients and flat input, or its reduction (flat input, output shard, Gloo's "
                       "receive buffers)"});
    e.terms.push_back({"activations", kept - act.loss_kept, describe_activations(act, ac) + ", less the loss's"});
  } else if (where == "layers") {
    e.terms.push_back({"gathered parameters", walk_gathered,
                       reshard ? "the root unit and a layer with the next prefetched"
                               : "the units whose backward has not run yet"});
    e.terms.push_back({"full gradients and reductions", walk_in_flight + walk_layer_grads + walk_root_grads,
                       (walk_layer_grads > 0 ? std::string("a layer's full gradients so far and the root's, a "
                                                           "reduction's input or one in flight")
                                             : std::string("a layer's reduction, the root's full gradients")) +
                           (walk_waiting > 0 ? "; " + mib(walk_waiting) +
                                                   " of them the partial gradients of the layers run twice, "
                                                   "waiting for their other run"
                                             : "")});
    e.terms.push_back({"activations and gradients so far",
                       backward_walk - walk_gathered - walk_in_flight - walk_layer_grads - walk_root_grads -
                           walk_work - tied_held,
                       "the layers not yet done" + std::string(ac ? ", one layer replayed" : "") +
                           ", the gradients of those done"});
    e.terms.push_back({"layer gradients in flight", walk_work,
                       "what a layer's backward holds beside what it kept: the gradients of its output and "
                       "input, the MLP's or attention's temporaries (T5: its stack's position bias's gradient)"});
    if (tied_held > 0) {
      e.terms.push_back({"tied table's gradient", tied_held, "the head's, waiting for the lookups' rows"});
    }
  } else if (backward_end == end_root_reduction && end_root_reduction > end_gradients) {
    e.terms.push_back({"gradients", new_grads - root_shard_grads, per_param + ", but the root's"});
    e.terms.push_back({"root reduce-scatter", end_reduction(root_trainable, root_full_grads),
                       "its full gradients and flat input, or the collective (the flat input, the output shard, "
                       "Gloo's receive buffers)"});
  } else if (backward_end == end_input_gather && end_input_gather > end_gradients) {
    e.terms.push_back({"gathered parameters", root_g + 2 * in_g,
                       "the root unit, and the embedding's being gathered again (held twice)"});
    e.terms.push_back({"gradients", new_grads + root_full_grads, per_param + ", the root's still full"});
  } else if (backward_end == end_input_reduction && end_input_reduction > end_gradients) {
    e.terms.push_back({"gradients", new_grads - root_shard_grads - in_shard_grads + root_full_grads,
                       per_param + ", the root's still full, but the embedding's"});
    e.terms.push_back({"embedding reduce-scatter", end_reduction(units.input_trainable, in_full_grads),
                       "the input edge unit's full gradients and flat input, or the collective"});
  } else {
    e.terms.push_back({"gathered parameters", root_g + in_g, in_g > 0 ? "the root unit and the embedding's"
                                                                      : "the root unit"});
    e.terms.push_back({"gradients", new_grads + root_full_grads + in_full_grads + tied_held,
                       per_param + (reduces ? ", the root's still full" : "") +
                           (tied_held > 0 ? ", the tied table's apart from .grad" : "")});
    if (comm > 0) {
      e.terms.push_back({job.strategy == parallel::Strategy::DDP ? "buckets" : "reduction in flight", comm,
                         job.strategy == parallel::Strategy::DDP ? "DDP's gradient buckets, the last ones all-reducing"
                                                        : "the last layer's"});
    }
  }
  return e;
}

std::string format_estimate(const std::string& model, const TrainingJob& job, const MemoryEstimate& e) {
  std::string out = "Training memory per rank for `" + model + "`: " + parallel::to_string(job.strategy) + ", " +
                    std::to_string(job.world) + " ranks" +
                    (job.nodes > 1 ? " on " + std::to_string(job.nodes) + " nodes" : "") + ", batch " +
                    std::to_string(job.batch) + " per rank" +
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
                    (job.cpu_offload ? ", CPU offload" : "") + (job.device == parallel::Device::CUDA ? " (CUDA)" : " (CPU)") + "\n";
  out += "  " + std::to_string(e.parameters) + " parameters in " + std::to_string(e.units) + " units\n";
  char line[256];
  for (const auto& t : e.terms) {
    std::snprintf(line, sizeof line, "  %-48s %14s   %s\n", t.name.c_str(), mib(t.bytes).c_str(), t.note.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-48s %14s   (forward %s, backward %s, step %s)\n",
                ("peak (" + e.peak_phase + ")").c_str(), mib(e.peak_bytes).c_str(), mib(e.forward_bytes).c_str(),
                mib(e.backward_bytes).c_str(), mib(e.step_bytes).c_str());
  out += line;
  if (e.host_bytes > 0) out += "  host memory (offloaded shards, gradients, AdamW state): " + mib(e.host_bytes) + "\n";
  return out;
}

std::string estimate_json(const std::string& model, const TrainingJob& job, const MemoryEstimate& e) {
  nlohmann::json j;
  j["model"] = model;
  j["job"] = {{"world", job.world},           {"nodes", job.nodes},
              {"strategy", parallel::to_string(job.strategy)}, {"mixed_precision", parallel::to_string(job.mixed_precision)},
              {"activation_checkpointing", job.activation_checkpointing}, {"cpu_offload", job.cpu_offload},
              {"batch", job.batch},           {"seq_len", job.seq_len}, {"cuda", job.device == parallel::Device::CUDA}};
  j["parameters"] = e.parameters, j["units"] = e.units, j["tokens"] = e.tokens;
  j["peak_bytes"] = e.peak_bytes, j["peak_phase"] = e.peak_phase;
  j["phases"] = {{"forward", e.forward_bytes}, {"backward", e.backward_bytes}, {"step", e.step_bytes}};
  j["host_bytes"] = e.host_bytes;
  for (const auto& t : e.terms) j["terms"].push_back({{"name", t.name}, {"bytes", t.bytes}, {"note", t.note}});
  return j.dump(2);
}

}  // namespace shardtrain::plan
