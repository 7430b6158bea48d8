#include "shardtrain/models/tensor_parallel.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "shardtrain/models/blocks.h"
#include "shardtrain/models/layers.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/nn/intercept.h"
#include "shardtrain/tp/regions.h"

namespace shardtrain::models {

namespace {

// '*' matches one whole segment of a dotted path.
bool path_matches(const std::string& pattern, const std::string& path) {
  size_t p = 0, q = 0;
  while (p < pattern.size() && q < path.size()) {
    if (pattern[p] == '*') {
      ++p;
      while (q < path.size() && path[q] != '.') ++q;
    } else if (pattern[p++] != path[q++]) {
      return false;
    }
  }
  return p == pattern.size() && q == path.size();
}

// The group sizes up to 64 that divide n, for an error message.
std::string divisors_text(int64_t n) {
  std::string out;
  for (int64_t d = 1; d <= std::min<int64_t>(n, 64); ++d) {
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  }
  return out;
}

void check_divides(int64_t n, int64_t ranks, const std::string& what) {
  if (n % ranks != 0) {
    throw std::invalid_argument("tensor parallelism over " + std::to_string(ranks) + " ranks: " + what + " (" +
                                std::to_string(n) + ") do not divide by " + std::to_string(ranks) +
                                "; tensor-parallel sizes that divide them: " + divisors_text(n));
  }
}

// Keeps this rank's slice of a parameter along dim (a copy of its own, the whole one freed).
void keep_slice(at::Tensor& param, int64_t dim, const dist::Communicator& group,
                std::vector<TensorParallel::Split>& split) {
  split.push_back({param, dim});
  at::NoGradGuard no_grad;
  const int64_t n = param.size(dim) / group.size();
  param.set_data(param.narrow(dim, group.rank() * n, n).clone());
}

template <class T>
T& module_as_style(torch::nn::Module& m, const std::string& path, TpStyle style, const char* expected) {
  auto* typed = dynamic_cast<T*>(&m);
  if (typed == nullptr) {
    throw std::invalid_argument("tensor parallelism: " + path + " is a " + m.name() + ", not " + expected +
                                " as its rule's style '" + to_string(style) + "' needs");
  }
  return *typed;
}

nn::InterceptPoint& intercept_point_of(torch::nn::Module& m, const std::string& path, TpStyle style) {
  nn::InterceptPoint* point = nn::as_intercept_point(m);
  if (point == nullptr) {
    throw std::invalid_argument("tensor parallelism: " + path + " (" + m.name() + ") cannot be intercepted, as " +
                                "its rule's style '" + to_string(style) + "' needs");
  }
  return *point;
}

// Around a module whose computation is split: its input enters the region (copied, or under sequence parallelism
// gathered over the sequence); a cross-attention's context (input 1) is whole already and is copied.
class EnterRegion : public nn::Interceptor {
 public:
  EnterRegion(dist::Communicator group, bool sequence_parallel, bool has_context)
      : group_(std::move(group)), sequence_parallel_(sequence_parallel), has_context_(has_context) {}
  nn::TensorVec around(torch::nn::Module&, nn::TensorVec inputs, const Next& next) override {
    inputs[0] = sequence_parallel_ ? tp::gather_along(inputs[0], 1, group_) : tp::copy_to_group(inputs[0], group_);
    if (has_context_ && inputs.size() > 1 && inputs[1].defined()) inputs[1] = tp::copy_to_group(inputs[1], group_);
    return next(std::move(inputs));
  }
  std::string name() const override { return "tensor-parallel region"; }

 private:
  dist::Communicator group_;
  bool sequence_parallel_, has_context_;
};

// The end of the sequence-parallel part: the module's output (B, T / t, C) gathered to (B, T, C).
class GatherSequence : public nn::Interceptor {
 public:
  explicit GatherSequence(dist::Communicator group) : group_(std::move(group)) {}
  nn::TensorVec around(torch::nn::Module&, nn::TensorVec inputs, const Next& next) override {
    nn::TensorVec out = next(std::move(inputs));
    out[0] = tp::gather_along(out[0], 1, group_);
    return out;
  }
  std::string name() const override { return "tensor-parallel sequence gather"; }

 private:
  dist::Communicator group_;
};

// A lookup in rows [start, start + rows) of the vocabulary (vocab_parallel_lookup around the module's own).
class VocabLookup : public nn::Interceptor {
 public:
  VocabLookup(VocabShard shard, bool sequence_parallel, int64_t rows)
      : shard_(std::move(shard)), sequence_parallel_(sequence_parallel), rows_(rows) {}
  nn::TensorVec around(torch::nn::Module&, nn::TensorVec inputs, const Next& next) override {
    nn::TensorVec rest = inputs;
    auto lookup = [&](const at::Tensor& local) {
      rest[0] = local;
      return next(rest)[0];
    };
    return {vocab_parallel_lookup(inputs[0], shard_, rows_, sequence_parallel_, lookup)};
  }
  std::string name() const override { return "tensor-parallel vocabulary lookup"; }

 private:
  VocabShard shard_;
  bool sequence_parallel_;
  int64_t rows_;
};

std::string shape_text(const at::Tensor& t) { return c10::str(t.sizes()); }

// What one module becomes under its style; returns what each rank now holds, for describe().
// Dry, it only checks (every module is checked before any is changed).
struct Applier {
  const dist::Communicator& group;
  bool sequence_parallel;
  std::vector<at::Tensor>& summed;  // parameters whose gradients reduce_gradients() sums
  std::vector<TensorParallel::Split>& split;  // parameters split over the group
  bool dry = false;

  void sum_if(bool when, torch::nn::Module& m, bool recurse = false) {
    if (!when || dry) return;
    for (auto& p : m.parameters(recurse)) summed.push_back(p);
  }

  std::string split_linear(LinearImpl& linear, const std::string& path, bool column) {
    const at::Tensor whole = linear.matrix();  // (out, in)
    const int64_t n = column ? whole.size(0) : whole.size(1);
    check_divides(n, group.size(), "the " + std::string(column ? "output" : "input") + " features of " + path);
    if (dry) return "";
    const std::string before = shape_text(linear.weight);
    // matrix() rows are stored rows, or columns when transposed (Conv1D's (in, out)).
    keep_slice(linear.weight, (column ? 0 : 1) ^ (linear.transposed ? 1 : 0), group, split);
    if (column && linear.bias.defined()) keep_slice(linear.bias, 0, group, split);
    if (!column) {
      const dist::Communicator g = group;
      linear.reduce_partial = sequence_parallel
                                  ? std::function<at::Tensor(const at::Tensor&)>(
                                        [g](const at::Tensor& y) { return tp::reduce_scatter_along(y, 1, g); })
                                  : [g](const at::Tensor& y) { return tp::reduce_from_group(y, g); };
      if (linear.bias.defined() && sequence_parallel) summed.push_back(linear.bias);
    }
    return "weight " + shape_text(linear.weight) + " of " + before;
  }

  std::string apply(torch::nn::Module& m, const std::string& path, TpStyle style) {
    switch (style) {
      case TpStyle::COLUMN:
      case TpStyle::ROW:
        return split_linear(module_as_style<LinearImpl>(m, path, style, "a Linear"), path, style == TpStyle::COLUMN);
      case TpStyle::ATTENTION: {
        auto& attention = module_as_style<AttentionImpl>(m, path, style, "an Attention");
        AttentionOptions& o = attention.options;
        if (o.fused_qkv) {
          throw std::invalid_argument("tensor parallelism: " + path + " projects q, k and v in one fused matrix, "
                                      "which this version does not split");
        }
        if (o.re_attention) {
          throw std::invalid_argument("tensor parallelism: " + path + " mixes its heads (re-attention), which a "
                                      "split by heads cannot");
        }
        check_divides(o.heads, group.size(), "the attention heads of " + path);
        check_divides(o.kv_heads, group.size(), "the key/value heads of " + path);
        intercept_point_of(m, path, style);
        if (dry) return "";
        const std::string before = std::to_string(o.heads) + " heads, " + std::to_string(o.kv_heads) + " key/value";
        o.heads /= group.size();
        o.kv_heads /= group.size();
        intercept_point_of(m, path, style).interceptors().add(
            std::make_shared<EnterRegion>(group, sequence_parallel, /*has_context=*/true));
        return std::to_string(o.heads) + " heads, " + std::to_string(o.kv_heads) + " key/value of " + before;
      }
      case TpStyle::ENTER: {
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        if (!dry) point.interceptors().add(std::make_shared<EnterRegion>(group, sequence_parallel, false));
        return "enters the region";
      }
      case TpStyle::HEAD_LOCAL:
        sum_if(true, m, /*recurse=*/true);
        return "whole, gradients summed";
      case TpStyle::SEQUENCE:
        sum_if(sequence_parallel, m, /*recurse=*/true);
        return sequence_parallel ? "whole, on the sequence slice" : "whole";
      case TpStyle::SEQUENCE_GATHER: {
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        sum_if(sequence_parallel, m, /*recurse=*/true);
        if (!sequence_parallel) return "whole";
        if (!dry) point.interceptors().add(std::make_shared<GatherSequence>(group));
        return "whole, on the sequence slice, output gathered";
      }
      case TpStyle::VOCAB_EMBEDDING: {
        at::Tensor weight = m.named_parameters(/*recurse=*/false)["weight"];
        check_divides(weight.size(0), group.size(), "the vocabulary rows of " + path);
        intercept_point_of(m, path, style);
        if (dry) return "";
        const std::string before = shape_text(weight);
        const int64_t rows = weight.size(0) / group.size();
        intercept_point_of(m, path, style).interceptors().add(
            std::make_shared<VocabLookup>(VocabShard{group.rank() * rows, group}, sequence_parallel, rows));
        keep_slice(weight, 0, group, split);
        return "weight " + shape_text(weight) + " of " + before;
      }
      case TpStyle::VOCAB_HEAD: {
        auto& head = module_as_style<VocabParallelTable>(m, path, style, "a vocabulary-parallel head");
        at::Tensor weight = m.named_parameters(/*recurse=*/false)["weight"];
        check_divides(weight.size(0), group.size(), "the vocabulary rows of " + path);
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        if (dry) return "";
        const std::string before = shape_text(weight);
        head.vocab_shard = VocabShard{group.rank() * (weight.size(0) / group.size()), group};
        keep_slice(weight, 0, group, split);
        // Under sequence parallelism the norm before it gathered its input, and that gather's backward sums the
        // ranks' parts of its gradient; otherwise the region's entry does.
        if (!sequence_parallel) {
          point.interceptors().add(std::make_shared<EnterRegion>(group, false, /*has_context=*/false));
        }
        return "weight " + shape_text(weight) + " of " + before + ", loss over split logits";
      }
      case TpStyle::VOCAB_TABLE: {
        auto& table = module_as_style<VocabParallelTable>(m, path, style, "a vocabulary-parallel table");
        at::Tensor weight = m.named_parameters(/*recurse=*/false)["weight"];
        check_divides(weight.size(0), group.size(), "the vocabulary rows of " + path);
        if (dry) return "";
        const std::string before = shape_text(weight);
        table.vocab_shard = VocabShard{group.rank() * (weight.size(0) / group.size()), group};
        table.sequence_parallel = sequence_parallel;
        keep_slice(weight, 0, group, split);
        return "weight " + shape_text(weight) + " of " + before + ", looked up and read by the head split";
      }
      case TpStyle::WHOLE:
        return "whole";
    }
    throw std::logic_error("tensor parallelism: unknown style");
  }
};

// LoRA adapters are refused by name.
void refuse_lora(torch::nn::Module& root, const std::string& prefix, const std::string& flavor) {
  for (const auto& item : root.named_modules(prefix, /*include_self=*/true)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear != nullptr && linear->has_lora()) {
      throw std::invalid_argument("tensor parallelism of " + flavor + ": " + item.key() + " has a LoRA adapter; " +
                                  "LoRA does not combine with tensor parallelism in this version");
    }
  }
}

}  // namespace

TpPlan transformer_layer_tp_plan(const std::string& layers, bool swiglu) {
  TpPlan plan = {{layers + ".norm1", TpStyle::SEQUENCE}, {layers + ".attn", TpStyle::ATTENTION},
                 {layers + ".attn.q", TpStyle::COLUMN},  {layers + ".attn.k", TpStyle::COLUMN},
                 {layers + ".attn.v", TpStyle::COLUMN},  {layers + ".attn.o", TpStyle::ROW},
                 {layers + ".norm2", TpStyle::SEQUENCE}, {layers + ".mlp", TpStyle::ENTER}};
  for (const char* in : swiglu ? std::vector<const char*>{"gate", "up"} : std::vector<const char*>{"fc1"}) {
    plan.push_back({layers + ".mlp." + in, TpStyle::COLUMN});
  }
  plan.push_back({layers + (swiglu ? ".mlp.down" : ".mlp.fc2"), TpStyle::ROW});
  return plan;
}

at::Tensor vocab_parallel_lookup(const at::Tensor& ids, const VocabShard& shard, int64_t rows, bool sequence_parallel,
                                 const std::function<at::Tensor(const at::Tensor&)>& lookup) {
  const int64_t ranks = shard.group.size();
  if (sequence_parallel && ids.dim() > 1 && ids.size(1) % ranks != 0) {
    throw std::invalid_argument("sequence parallelism over " + std::to_string(ranks) + " ranks: a batch of " +
                                std::to_string(ids.size(1)) + " tokens per sequence, which does not divide by " +
                                std::to_string(ranks) + " (pad sequences to a multiple of it)");
  }
  const at::Tensor local = ids - shard.start;
  const at::Tensor outside = (local < 0) | (local >= rows);
  const at::Tensor partial = lookup(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0);
  return sequence_parallel ? tp::reduce_scatter_along(partial, 1, shard.group)
                           : tp::reduce_from_group(partial, shard.group);
}

std::string to_string(TpStyle style) {
  switch (style) {
    case TpStyle::COLUMN: return "column";
    case TpStyle::ROW: return "row";
    case TpStyle::ATTENTION: return "attention";
    case TpStyle::ENTER: return "enter";
    case TpStyle::HEAD_LOCAL: return "head_local";
    case TpStyle::SEQUENCE: return "sequence";
    case TpStyle::SEQUENCE_GATHER: return "sequence_gather";
    case TpStyle::VOCAB_EMBEDDING: return "vocab_embedding";
    case TpStyle::VOCAB_HEAD: return "vocab_head";
    case TpStyle::VOCAB_TABLE: return "vocab_table";
    case TpStyle::WHOLE: return "whole";
  }
  return "?";
}

void TensorParallel::reduce_gradients() const {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : summed_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (group_.size() == 1 || grads.empty()) return;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& g : grads) flat.push_back(g.reshape({-1}));
  at::Tensor buffer = at::cat(flat);
  group_.all_reduce(buffer, dist::ReduceOp::SUM).wait();
  int64_t offset = 0;
  for (at::Tensor& g : grads) {
    g.copy_(buffer.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
}

double TensorParallel::clip_grad_norm(torch::nn::Module& root, double max_norm,
                                      const dist::Communicator* shard_group) const {
  std::set<const c10::TensorImpl*> split;
  for (const Split& s : split_) split.insert(s.param.unsafeGetTensorImpl());
  // [split, whole] sums of squares in float64 over this rank's gradients (data parallelism's shards of them).
  at::Tensor sums = at::zeros({2}, at::kDouble);
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : root.parameters()) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    sums[split.count(p.unsafeGetTensorImpl()) ? 0 : 1] += p.grad().to(at::kDouble).pow(2).sum();
  }
  const at::Device device = group_.size() > 1 ? group_.device() : at::Device(at::kCPU);
  sums = sums.to(shard_group != nullptr ? shard_group->device() : device);
  if (shard_group != nullptr) shard_group->all_reduce(sums, dist::ReduceOp::SUM).wait();
  // Whole parameters' gradients are the same on every rank of the group (reduce_gradients): counted once.
  at::Tensor split_sum = sums.narrow(0, 0, 1).to(device).clone();
  group_.all_reduce(split_sum, dist::ReduceOp::SUM).wait();
  const double norm = std::sqrt(split_sum.item<double>() + sums[1].item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads) g.mul_(coefficient);
  }
  return norm;
}

std::optional<int64_t> TensorParallel::split_dim(const at::Tensor& param) const {
  for (const Split& s : split_) {
    if (s.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return s.dim;
  }
  return std::nullopt;
}

TensorParallelizer::TensorParallelizer(std::shared_ptr<const ModelRecipe> recipe, dist::Communicator group,
                                       TensorParallelOptions options)
    : recipe_(std::move(recipe)), group_(std::move(group)), options_(options), plan_(recipe_->tp_plan()),
      matched_(plan_.size(), 0), held_(plan_.size()) {
  if (plan_.empty()) {
    throw std::invalid_argument("tensor parallelism: the " + recipe_->family() + " family (" + recipe_->flavor() +
                                ") has no tensor-parallel plan");
  }
  if (options_.sequence_parallel &&
      std::none_of(plan_.begin(), plan_.end(), [](const TpRule& r) {
        return r.style == TpStyle::VOCAB_EMBEDDING || r.style == TpStyle::VOCAB_TABLE;
      })) {
    throw std::invalid_argument("sequence parallelism of " + recipe_->flavor() + ": the " + recipe_->family() +
                                " family's plan has no embedding that splits the sequence among the ranks");
  }
}

void TensorParallelizer::split_modules(torch::nn::Module& subtree, const std::string& prefix, bool include_self) {
  const std::string flavor = recipe_->flavor();
  refuse_lora(subtree, prefix, flavor);
  // Each module's rule (one at most), every module checked before any changes.
  std::vector<std::tuple<std::string, torch::nn::Module*, size_t>> todo;
  for (const auto& item : subtree.named_modules(prefix, include_self)) {
    if (done_.count(item.key())) continue;
    std::optional<size_t> rule;
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (!path_matches(plan_[i].module, item.key())) continue;
      if (rule) {
        throw std::invalid_argument("tensor parallelism of " + flavor + ": " + item.key() +
                                    " is matched by two rules of its plan");
      }
      rule = i;
    }
    // A module that holds parameters of its own needs a rule (a rule covers its module's own parameters only).
    if (!rule && !item.value()->named_parameters(/*recurse=*/false).is_empty()) {
      throw std::invalid_argument("tensor parallelism of " + flavor + ": parameter " + item.key() + "." +
                                  item.value()->named_parameters(false).keys().front() + " (module '" + item.key() +
                                  "') is under no rule of the family's plan");
    }
    if (rule) todo.emplace_back(item.key(), item.value().get(), *rule);
  }
  Applier checker{group_, options_.sequence_parallel, summed_, split_, /*dry=*/true};
  for (const auto& [path, module, rule] : todo) checker.apply(*module, path, plan_[rule].style);
  Applier applier{group_, options_.sequence_parallel, summed_, split_};
  for (const auto& [path, module, rule] : todo) {
    held_[rule] = applier.apply(*module, path, plan_[rule].style);
    ++matched_[rule];
    done_.insert(path);
  }
}

void TensorParallelizer::split_layer(const std::string& name, torch::nn::Module& layer) {
  for (const at::Tensor& p : layer.parameters()) {
    if (counted_.insert(p.unsafeGetTensorImpl()).second) whole_parameters_ += p.numel();
  }
  split_modules(layer, name, /*include_self=*/true);
}

TensorParallel TensorParallelizer::finish(ZooModel& model) {
  torch::nn::Module& root = *model.module;
  // Whole parameters: what split_layer counted, and the rest of the model as it still is.
  for (const at::Tensor& p : root.parameters()) {
    if (counted_.insert(p.unsafeGetTensorImpl()).second) whole_parameters_ += p.numel();
  }
  split_modules(root, "", /*include_self=*/false);
  std::vector<std::string> lines;
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (matched_[i] == 0) {
      throw std::invalid_argument("tensor parallelism of " + model.flavor + ": the plan's rule '" + plan_[i].module +
                                  "' matches no module of the model");
    }
    lines.push_back(plan_[i].module + (matched_[i] > 1 ? " (" + std::to_string(matched_[i]) + " modules)" : "") +
                    ": " + to_string(plan_[i].style) + ", " + held_[i]);
  }
  return TensorParallel(group_, options_.sequence_parallel, std::move(split_), std::move(summed_), std::move(lines),
                        whole_parameters_);
}

TensorParallel tensor_parallelize(ZooModel& model, const dist::Communicator& group,
                                  const TensorParallelOptions& options) {
  return TensorParallelizer(model.recipe, group, options).finish(model);
}

}  // namespace shardtrain::models
