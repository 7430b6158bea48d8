#include "shardtrain/plan/memory_model.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "shardtrain/fsdp/wrap_policy.h"

namespace shardtrain::plan {

namespace {

const std::vector<std::pair<std::string, Strategy>>& strategies() {
  static const std::vector<std::pair<std::string, Strategy>> table = {
      {"full_shard", Strategy::kFullShard},           {"shard_grad_op", Strategy::kShardGradOp},
      {"no_shard", Strategy::kNoShard},               {"hybrid_shard", Strategy::kHybridShard},
      {"hybrid_shard_zero2", Strategy::kHybridShardZero2}, {"ddp", Strategy::kDdp}};
  return table;
}

// Parameter counts (tied tensors once) of the FSDP units: each transformer layer, then the root (the rest); and
// the largest single parameter.
std::vector<int64_t> unit_sizes(const models::ModelRecipe& recipe, int64_t& largest_tensor) {
  models::BuildOptions meta;
  meta.tensors = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  const auto root = recipe.build(meta);
  std::set<const c10::TensorImpl*> seen;
  auto count = [&seen](const torch::nn::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters(/*recurse=*/true)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
    }
    return n;
  };
  largest_tensor = 0;
  for (const auto& p : root->parameters(/*recurse=*/true)) largest_tensor = std::max(largest_tensor, p.numel());
  std::vector<int64_t> units;
  for (const auto& m : root->modules(/*include_self=*/false)) {
    if (fsdp::module_class_name(*m) == recipe.layer_class()) units.push_back(count(*m));
  }
  units.push_back(count(*root));  // what no layer holds: embeddings, heads, final norms
  return units;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

Strategy parse_strategy(const std::string& name) {
  std::string list;
  for (const auto& [n, s] : strategies()) {
    if (n == name) return s;
    list += (list.empty() ? "" : ", ") + n;
  }
  throw std::invalid_argument("unknown strategy '" + name + "' (expected one of " + list + ")");
}

std::string strategy_name(Strategy s) {
  for (const auto& [n, v] : strategies()) {
    if (v == s) return n;
  }
  return "?";
}

MemoryEstimate estimate_training_memory(const models::ModelRecipe& recipe, const TrainingJob& job) {
  if (job.world < 1 || job.nodes < 1 || job.world % job.nodes != 0) {
    throw std::invalid_argument("a world of " + std::to_string(job.world) + " ranks does not divide into " +
                                std::to_string(job.nodes) + " nodes (expected num_processes a multiple of nnodes)");
  }
  if (job.batch < 1) throw std::invalid_argument("batch size " + std::to_string(job.batch) + " (expected >= 1)");
  if (job.mixed_precision != "no" && job.mixed_precision != "bf16" && job.mixed_precision != "fp16") {
    throw std::invalid_argument("mixed precision '" + job.mixed_precision + "' (expected no, bf16 or fp16)");
  }
  models::ActivationQuery query;
  query.batch = job.batch, query.seq_len = job.seq_len, query.cuda = job.cuda;
  query.compute = job.mixed_precision == "bf16" ? at::kBFloat16 : job.mixed_precision == "fp16" ? at::kHalf : at::kFloat;
  const models::ActivationBytes act = recipe.activation_bytes(query);

  MemoryEstimate e;
  int64_t largest_tensor = 0;
  const std::vector<int64_t> units = unit_sizes(recipe, largest_tensor);
  for (int64_t u : units) e.parameters += u;
  e.units = static_cast<int64_t>(units.size());
  const int64_t pe = 4, ce = static_cast<int64_t>(c10::elementSize(query.compute));
  const bool hybrid = job.strategy == Strategy::kHybridShard || job.strategy == Strategy::kHybridShardZero2;
  const bool replicated = job.strategy == Strategy::kDdp || job.strategy == Strategy::kNoShard;
  // Ranks a parameter is sharded over: the node for hybrid strategies, everyone for the others, one when replicated.
  const int64_t shard = replicated ? 1 : hybrid ? job.world / job.nodes : job.world;
  const bool mixed = ce != pe;
  const int64_t largest_layer = units.size() > 1 ? *std::max_element(units.begin(), units.end() - 1) : 0;
  const int64_t root_unit = units.back();

  // Sharded state: each unit's flat parameter padded to a multiple of the shard group.
  int64_t shard_numel = 0;
  for (int64_t u : units) shard_numel += ceil_div(u, shard);
  const int64_t params = shard_numel * pe, grads = shard_numel * pe, adam = 2 * shard_numel * 4;
  const bool offload = job.cpu_offload && job.strategy != Strategy::kDdp;
  if (offload) e.host_bytes = params + grads + adam;
  const int64_t dev_params = offload ? 0 : params, dev_grads = offload ? 0 : grads, dev_adam = offload ? 0 : adam;

  // Full parameters gathered at once (compute dtype). A group of one with no cast holds its parameters as they are.
  const bool gathers = shard > 1 || mixed || offload;
  const bool reshard_after_forward = job.strategy == Strategy::kFullShard || job.strategy == Strategy::kHybridShard;
  int64_t gathered_forward = 0, gathered_backward = 0;
  if (gathers) {
    // The root stays gathered through forward and backward; a layer is gathered with the next one prefetched.
    const int64_t two_layers = 2 * largest_layer * ce, root = root_unit * ce;
    gathered_forward = root + (reshard_after_forward ? two_layers : (e.parameters - root_unit) * ce);
    gathered_backward = reshard_after_forward ? root + two_layers : e.parameters * ce;
  }
  // Backward's communication: one unit's full gradients (compute dtype) and its reduce-scatter input in flight
  // while the next unit computes; DDP's buckets (25 MiB each, two in flight).
  int64_t comm = 0;
  if (job.strategy == Strategy::kDdp && job.world > 1) {
    comm = std::min<int64_t>(2 * 25 * 1024 * 1024, e.parameters * pe);
  } else if (gathers && shard > 1) {
    comm = 2 * largest_layer * ce;
  }

  // Activations. Forward ends with everything kept plus the loss's logits; backward starts with everything kept
  // plus the loss's gradients, then frees a layer's activations as its gradients arrive (walked below).
  const bool ac = job.activation_checkpointing;
  const int64_t kept = act.kept(ac);
  const int64_t layer_kept = ac ? act.layer_input : act.per_layer;
  const int64_t layer_grads = largest_layer * pe;
  // A checkpointed layer replays its forward in backward: its full activations exist again, one layer at a time.
  const int64_t replay = ac ? act.per_layer : 0;
  int64_t backward_activations = kept + act.backward_transient;
  for (int64_t i = 0; i <= act.layers; ++i) {
    const int64_t walked = (act.layers - i) * layer_kept + act.outside_layers + replay +
                           (offload ? 0 : std::min<int64_t>(i * layer_grads / shard, grads));
    backward_activations = std::max(backward_activations, walked);
  }

  const int64_t base = dev_params + dev_adam;
  e.forward_bytes = base + gathered_forward + kept + act.loss_transient;
  e.backward_bytes = base + gathered_backward + comm + backward_activations;
  // AdamW (LibTorch's, a parameter at a time): sqrt(v) and its quotient by the bias correction exist together, two
  // temporaries of the largest (sharded, per-parameter) tensor.
  const int64_t adam_temp = offload ? 0 : 2 * ceil_div(largest_tensor, shard) * pe;
  e.step_bytes = base + dev_grads + adam_temp;
  e.peak_bytes = std::max({e.forward_bytes, e.backward_bytes, e.step_bytes});
  e.peak_phase = e.peak_bytes == e.backward_bytes ? "backward" : e.peak_bytes == e.forward_bytes ? "forward" : "step";

  const std::string per = shard > 1 ? " / " + std::to_string(shard) + " ranks" : "";
  e.terms.push_back({"parameters", dev_params, std::to_string(shard_numel) + " elements x 4 B" + per +
                                                   (offload ? " (offloaded: host)" : "")});
  e.terms.push_back({"AdamW state", dev_adam, "2 moments x 4 B per parameter" + per});
  if (e.peak_phase == "step") {
    e.terms.push_back({"gradients", dev_grads, "4 B per parameter" + per});
    e.terms.push_back({"optimizer temporaries", adam_temp, "AdamW's per-tensor temporaries"});
    return e;
  }
  const bool fwd = e.peak_phase == "forward";
  e.terms.push_back({"gathered parameters", fwd ? gathered_forward : gathered_backward,
                     !gathers ? "none: a group of one holds its parameters"
                     : reshard_after_forward ? "the root unit and two layers (prefetch), compute dtype"
                                             : "every unit, kept gathered between forward and backward"});
  if (!fwd) e.terms.push_back({"communication buffers", comm, "one unit's full gradients and its reduce-scatter"});
  e.terms.push_back({ac ? "activations (checkpointed layers: inputs only)" : "activations",
                     kept, std::to_string(act.layers) + " layers x " + mib(layer_kept) + " + " +
                               mib(act.outside_layers) + " outside the layers"});
  if (fwd) {
    e.terms.push_back({"loss (logits)", act.loss_transient, "logits and their float32 copies"});
  } else {
    e.terms.push_back({"backward transients", backward_activations - kept,
                       (ac ? "one layer replayed (" + mib(replay) + "); " : std::string()) +
                           "the loss's gradients, or gradients arriving as layers are freed"});
  }
  return e;
}

std::string format_estimate(const std::string& model, const TrainingJob& job, const MemoryEstimate& e) {
  std::string out = "Training memory per rank for `" + model + "`: " + strategy_name(job.strategy) + ", " +
                    std::to_string(job.world) + " ranks" +
                    (job.nodes > 1 ? " on " + std::to_string(job.nodes) + " nodes" : "") + ", batch " +
                    std::to_string(job.batch) + " per rank, mixed precision " + job.mixed_precision +
                    (job.activation_checkpointing ? ", activation checkpointing" : "") +
                    (job.cpu_offload ? ", CPU offload" : "") + (job.cuda ? " (CUDA)" : " (CPU)") + "\n";
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
              {"strategy", strategy_name(job.strategy)}, {"mixed_precision", job.mixed_precision},
              {"activation_checkpointing", job.activation_checkpointing}, {"cpu_offload", job.cpu_offload},
              {"batch", job.batch},           {"seq_len", job.seq_len}, {"cuda", job.cuda}};
  j["parameters"] = e.parameters, j["units"] = e.units;
  j["peak_bytes"] = e.peak_bytes, j["peak_phase"] = e.peak_phase;
  j["phases"] = {{"forward", e.forward_bytes}, {"backward", e.backward_bytes}, {"step", e.step_bytes}};
  j["host_bytes"] = e.host_bytes;
  for (const auto& t : e.terms) j["terms"].push_back({{"name", t.name}, {"bytes", t.bytes}, {"note", t.note}});
  return j.dump(2);
}

}  // namespace shardtrain::plan
