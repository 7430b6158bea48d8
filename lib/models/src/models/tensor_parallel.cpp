#include "shardtrain/models/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

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
#include "shardtrain/tp/rng_fork.h"

namespace shardtrain::models {

namespace {

// '*' matches one whole segment of a dotted path; a final ".**" the module before it and every module below.
bool path_matches(const std::string& pattern, const std::string& path) {
  constexpr char kSubtree[] = ".**";
  if (pattern.size() > 3 && pattern.compare(pattern.size() - 3, 3, kSubtree) == 0) {
    const std::string top = pattern.substr(0, pattern.size() - 3);
    if (path_matches(top, path)) return true;
    const size_t dot = path.rfind('.');
    return dot != std::string::npos && path_matches(pattern, path.substr(0, dot));
  }
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

// Keeps this rank's part of a parameter (a copy of its own, the whole one freed).
void keep_slice(at::Tensor& param, const tp::SplitLayout& layout, const dist::Communicator& group,
                std::vector<TensorParallel::Split>& split) {
  split.push_back({param, layout, param.size(layout.dim)});
  at::NoGradGuard no_grad;
  param.set_data(tp::slice_of(param, layout, group.rank(), group.size()).clone());
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
// gathered over the sequence); a cross-attention's context (input 1) is whole already and is copied. Its random
// draws (attention's dropout on this rank's heads, the MLP's on its width) are this rank's own (tp/rng_fork.h);
// under sequence parallelism its layer's are already (ForkRandom).
class EnterRegion : public nn::Interceptor {
 public:
  EnterRegion(dist::Communicator group, bool sequence_parallel, bool has_context)
      : group_(std::move(group)), sequence_parallel_(sequence_parallel), has_context_(has_context) {}
  nn::TensorVec around(torch::nn::Module&, nn::TensorVec inputs, const Next& next) override {
    inputs[0] = sequence_parallel_ ? tp::gather_along(inputs[0], 1, group_) : tp::copy_to_group(inputs[0], group_);
    if (has_context_ && inputs.size() > 1 && inputs[1].defined()) inputs[1] = tp::copy_to_group(inputs[1], group_);
    if (sequence_parallel_) return next(std::move(inputs));
    const tp::RngFork fork(inputs[0].device(), group_.rank());
    return next(std::move(inputs));
  }
  std::string name() const override { return "tensor-parallel region"; }

 private:
  dist::Communicator group_;
  bool sequence_parallel_, has_context_;
};

// A module whose every random draw is this rank's own (a transformer layer under sequence parallelism: its stream
// is this rank's slice of the tokens, its regions this rank's heads and width).
class ForkRandom : public nn::Interceptor {
 public:
  explicit ForkRandom(int64_t rank) : rank_(rank) {}
  nn::TensorVec around(torch::nn::Module&, nn::TensorVec inputs, const Next& next) override {
    const tp::RngFork fork(inputs[0].device(), rank_);
    return next(std::move(inputs));
  }
  std::string name() const override { return "tensor-parallel random stream"; }

 private:
  int64_t rank_;
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

// gather_vocabulary's node: the ranks' parts padded to the longest, all-gathered, unpadded; backward keeps this
// rank's columns.
struct GatherVocabulary : public torch::autograd::Function<GatherVocabulary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const VocabShard* shard) {
    const int64_t ranks = shard->group.size(), longest = tp::part_of(shard->vocab, ranks, 0).size;
    ctx->saved_data["start"] = shard->start;
    ctx->saved_data["rows"] = logits.size(-1);
    const at::Tensor first = logits.movedim(-1, 0).contiguous();  // (rows, ...)
    std::vector<int64_t> shape = first.sizes().vec();
    shape[0] = longest;
    at::Tensor padded = at::zeros(shape, logits.options());
    padded.narrow(0, 0, first.size(0)).copy_(first);
    shape[0] = longest * ranks;
    at::Tensor all = at::empty(shape, logits.options());
    shard->group.all_gather(all, padded).wait();
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < ranks; ++r) {
      parts.push_back(all.narrow(0, r * longest, tp::part_of(shard->vocab, ranks, r).size));
    }
    return at::cat(parts, 0).movedim(0, -1).contiguous();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t start = ctx->saved_data["start"].toInt(), rows = ctx->saved_data["rows"].toInt();
    return {grads[0].narrow(-1, start, rows).contiguous(), at::Tensor()};
  }
};

// What one module becomes under its style; returns what each rank now holds, for describe().
// Dry, it only checks (every module is checked before any is changed).
struct Applier {
  const dist::Communicator& group;
  bool sequence_parallel;
  std::vector<at::Tensor>& summed;  // parameters whose gradients reduce_gradients() sums
  std::vector<TensorParallel::Split>& split;  // parameters split over the group
  bool dry = false;
  // Key/value projections ("layers.0.attn.k") whose heads are fewer than the ranks: their head count, each head
  // held by ranks / heads ranks (set by their attention's rule, which comes first).
  std::map<std::string, int64_t> replicated_heads = {};

  void sum_if(bool when, torch::nn::Module& m, bool recurse = false) {
    if (!when || dry) return;
    for (auto& p : m.parameters(recurse)) summed.push_back(p);
  }

  // sections: the output's equal sections (a fused q, k, v: 3), each split alike; column-wise only.
  std::string split_linear(LinearImpl& linear, const std::string& path, bool column, int64_t sections = 1) {
    const at::Tensor whole = linear.matrix();  // (out, in)
    const int64_t n = (column ? whole.size(0) : whole.size(1)) / sections;
    auto replicated = replicated_heads.find(path);
    const int64_t parts = replicated == replicated_heads.end() ? 0 : replicated->second;
    if (parts == 0) {
      check_divides(n, group.size(),
                    (sections == 3 ? "each of q, k and v's output features of " : column ? "the output features of "
                                                                                          : "the input features of ") +
                        path);
    }
    if (dry) return "";
    const std::string before = shape_text(linear.weight);
    // matrix() rows are stored rows, or columns when transposed (Conv1D's (in, out)).
    keep_slice(linear.weight, {(column ? 0 : 1) ^ (linear.transposed ? 1 : 0), sections, parts}, group, split);
    if (column && linear.bias.defined()) keep_slice(linear.bias, {0, sections, parts}, group, split);
    // A LoRA adapter splits with its base (Megatron's LoRA layers): column-wise, B's rows as the weight's and A
    // whole on the region's whole input; row-wise, A's columns as the weight's and B whole, its term a partial sum
    // reduced with the base product (LinearImpl::forward). Either way the whole factor's gradient is a partial sum.
    if (linear.has_lora()) {
      if (column) {
        keep_slice(linear.lora_B->weight, {0, sections, parts}, group, split);
      } else {
        keep_slice(linear.lora_A->weight, {1, 1}, group, split);
      }
      summed.push_back(column ? linear.lora_A->weight : linear.lora_B->weight);
    }
    if (!column) {
      const dist::Communicator g = group;
      linear.reduce_partial = sequence_parallel
                                  ? std::function<at::Tensor(const at::Tensor&)>(
                                        [g](const at::Tensor& y) { return tp::reduce_scatter_along(y, 1, g); })
                                  : [g](const at::Tensor& y) { return tp::reduce_from_group(y, g); };
      if (linear.bias.defined() && sequence_parallel) summed.push_back(linear.bias);
    }
    return "weight " + shape_text(linear.weight) + " of " + before +
           (parts > 0 ? ", each head on " + std::to_string(group.size() / parts) + " ranks" : "") +
           (linear.has_lora() ? column ? ", LoRA's B split" : ", LoRA's A split" : "");
  }

  // A (vocab, dim) table's rows, as even as they can be (tp/split.h): this rank's shard of the vocabulary.
  VocabShard split_vocabulary(at::Tensor& weight, const std::string& path) {
    if (weight.size(0) < group.size()) {
      throw std::invalid_argument("tensor parallelism over " + std::to_string(group.size()) + " ranks: the " +
                                  std::to_string(weight.size(0)) + " vocabulary rows of " + path +
                                  " leave a rank none");
    }
    const tp::Part part = tp::part_of(weight.size(0), group.size(), group.rank());
    VocabShard shard{part.start, weight.size(0), group};
    if (!dry) keep_slice(weight, {0, 1}, group, split);
    return shard;
  }

  std::string apply(torch::nn::Module& m, const std::string& path, TpStyle style) {
    switch (style) {
      case TpStyle::COLUMN:
      case TpStyle::ROW:
        return split_linear(module_as_style<LinearImpl>(m, path, style, "a Linear"), path, style == TpStyle::COLUMN);
      case TpStyle::FUSED_QKV:
        return split_linear(module_as_style<LinearImpl>(m, path, style, "a Linear"), path, true, /*sections=*/3);
      case TpStyle::ATTENTION: {
        auto& attention = module_as_style<AttentionImpl>(m, path, style, "an Attention");
        AttentionOptions& o = attention.options;
        if (o.fused_qkv && o.kv_heads != o.heads) {
          throw std::invalid_argument("tensor parallelism: " + path + " projects q and fewer key/value heads in one "
                                      "fused matrix, whose unequal sections this version does not split");
        }
        if (o.re_attention) {
          throw std::invalid_argument("tensor parallelism: " + path + " mixes its heads (re-attention), which a "
                                      "split by heads cannot");
        }
        const int64_t t = group.size();
        check_divides(o.heads, t, "the attention heads of " + path);
        // Fewer key/value heads than ranks: each held whole by t / kv_heads ranks, those whose query heads read it.
        const bool replicate = o.kv_heads % t != 0 && t % o.kv_heads == 0 && !o.fused_qkv;
        if (o.kv_heads % t != 0 && !replicate) {
          std::string sizes;
          for (int64_t d = 1; d <= std::min<int64_t>(o.heads, 64); ++d) {
            if (o.heads % d == 0 && (o.kv_heads % d == 0 || d % o.kv_heads == 0)) {
              sizes += (sizes.empty() ? "" : ", ") + std::to_string(d);
            }
          }
          throw std::invalid_argument("tensor parallelism over " + std::to_string(t) + " ranks: the " +
                                      std::to_string(o.kv_heads) + " key/value heads of " + path +
                                      " neither divide by " + std::to_string(t) + " nor divide it (a head on " +
                                      "every rank's share of the query heads); tensor-parallel sizes that work: " +
                                      sizes);
        }
        if (replicate) {
          for (const char* p : {".k", ".v"}) replicated_heads[path + p] = o.kv_heads;
        }
        intercept_point_of(m, path, style);
        if (dry) return "";
        const std::string before = std::to_string(o.heads) + " heads, " + std::to_string(o.kv_heads) + " key/value";
        o.heads /= t;
        o.kv_heads = replicate ? 1 : o.kv_heads / t;
        intercept_point_of(m, path, style).interceptors().add(
            std::make_shared<EnterRegion>(group, sequence_parallel, /*has_context=*/true));
        return std::to_string(o.heads) + " heads, " + std::to_string(o.kv_heads) + " key/value of " + before;
      }
      case TpStyle::LAYER: {
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        if (!sequence_parallel) return "its regions draw this rank's random numbers";
        if (!dry) point.interceptors().add(std::make_shared<ForkRandom>(group.rank()));
        return "draws this rank's random numbers (its slice of the sequence)";
      }
      case TpStyle::ENTER: {
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        if (!dry) point.interceptors().add(std::make_shared<EnterRegion>(group, sequence_parallel, false));
        return "enters the region";
      }
      case TpStyle::HEAD_LOCAL:
        sum_if(true, m, /*recurse=*/true);
        return "whole, gradients summed";
      case TpStyle::HEAD_TABLE: {
        at::Tensor weight = m.named_parameters(/*recurse=*/false)["weight"];
        check_divides(weight.size(1), group.size(), "the attention heads (columns) of " + path);
        if (dry) return "";
        const std::string before = shape_text(weight);
        keep_slice(weight, {1, 1}, group, split);
        return "weight " + shape_text(weight) + " of " + before + ", this rank's heads";
      }
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
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        const std::string before = shape_text(weight);
        const VocabShard shard = split_vocabulary(weight, path);
        if (dry) return "";
        point.interceptors().add(std::make_shared<VocabLookup>(shard, sequence_parallel, weight.size(0)));
        return "weight " + shape_text(weight) + " of " + before;
      }
      case TpStyle::VOCAB_HEAD: {
        auto& head = module_as_style<VocabParallelTable>(m, path, style, "a vocabulary-parallel head");
        at::Tensor weight = m.named_parameters(/*recurse=*/false)["weight"];
        nn::InterceptPoint& point = intercept_point_of(m, path, style);
        const std::string before = shape_text(weight);
        const VocabShard shard = split_vocabulary(weight, path);
        if (dry) return "";
        head.vocab_shard = shard;
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
        const std::string before = shape_text(weight);
        const VocabShard shard = split_vocabulary(weight, path);
        if (dry) return "";
        table.vocab_shard = shard;
        table.sequence_parallel = sequence_parallel;
        return "weight " + shape_text(weight) + " of " + before + ", looked up and read by the head split";
      }
      case TpStyle::WHOLE:
        return "whole";
    }
    throw std::logic_error("tensor parallelism: unknown style");
  }
};

// What a rank's sum over its slice of a split parameter counts for in the group's: 1 / the ranks holding the same
// part (a replicated key/value head), else 1.
double share_of(const TensorParallel::Split& s, int64_t ranks) {
  return s.layout.parts > 0 ? static_cast<double>(s.layout.parts) / static_cast<double>(ranks) : 1.0;
}

// The adapters (lora_A, lora_B) of `root`'s LoRA Linears: split or kept whole by their base's rule.
std::set<const torch::nn::Module*> lora_adapters(torch::nn::Module& root) {
  std::set<const torch::nn::Module*> out;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto* linear = dynamic_cast<LinearImpl*>(m.get());
    if (linear != nullptr && linear->has_lora()) out.insert({linear->lora_A.get(), linear->lora_B.get()});
  }
  return out;
}

}  // namespace

bool splits_sequence(const TpPlan& plan) {
  return std::any_of(plan.begin(), plan.end(), [](const TpRule& r) {
    return r.style == TpStyle::VOCAB_EMBEDDING || r.style == TpStyle::VOCAB_TABLE;
  });
}

TpPlan transformer_layer_tp_plan(const std::string& layers, const TransformerLayerOptions& layer) {
  const bool swiglu = layer.activation == Activation::kSwiGlu;
  TpPlan plan = {{layers, TpStyle::LAYER},
                 {layers + ".norm1", TpStyle::SEQUENCE},
                 {layers + ".attn", TpStyle::ATTENTION}};
  if (layer.attention.fused_qkv) {
    plan.push_back({layers + ".attn.qkv", TpStyle::FUSED_QKV});
  } else {
    for (const char* p : {".attn.q", ".attn.k", ".attn.v"}) plan.push_back({layers + p, TpStyle::COLUMN});
  }
  plan.push_back({layers + ".attn.o", TpStyle::ROW});
  if (layer.cross_attention) {
    for (TpRule rule : std::vector<TpRule>{{layers + ".norm_cross", TpStyle::SEQUENCE},
                                           {layers + ".cross_attn", TpStyle::ATTENTION},
                                           {layers + ".cross_attn.q", TpStyle::COLUMN},
                                           {layers + ".cross_attn.k", TpStyle::COLUMN},
                                           {layers + ".cross_attn.v", TpStyle::COLUMN},
                                           {layers + ".cross_attn.o", TpStyle::ROW}}) {
      plan.push_back(std::move(rule));
    }
  }
  plan.push_back({layers + ".norm2", TpStyle::SEQUENCE});
  plan.push_back({layers + ".mlp", TpStyle::ENTER});
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

at::Tensor gather_vocabulary(const at::Tensor& logits, const VocabShard& shard) {
  if (shard.group.size() == 1) return logits;
  return GatherVocabulary::apply(logits, &shard);
}

std::string to_string(TpStyle style) {
  switch (style) {
    case TpStyle::COLUMN: return "column";
    case TpStyle::FUSED_QKV: return "fused_qkv";
    case TpStyle::ROW: return "row";
    case TpStyle::ATTENTION: return "attention";
    case TpStyle::LAYER: return "layer";
    case TpStyle::ENTER: return "enter";
    case TpStyle::HEAD_LOCAL: return "head_local";
    case TpStyle::HEAD_TABLE: return "head_table";
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
  const int64_t t = group_.size(), rank = group_.rank();
  if (t == 1) return;
  // Each gradient's place in one flat buffer summed over the group: a summed parameter's at its own offset; a
  // replicated part's (parts, n) slots, each rank's in its part's row and zeros elsewhere, so that the sum is over
  // the ranks holding the same part.
  struct Slot {
    at::Tensor grad;
    int64_t offset, row;  // row: the gradient's slot in its part rows (0 for a summed one)
  };
  std::vector<Slot> slots;
  int64_t size = 0;
  for (const at::Tensor& p : summed_) {
    if (!p.grad().defined()) continue;
    slots.push_back({p.grad(), size, 0});
    size += p.grad().numel();
  }
  for (const Split& s : split_) {
    if (s.layout.parts == 0 || !s.param.grad().defined()) continue;
    slots.push_back({s.param.grad(), size, s.layout.part_index(rank, t)});
    size += s.layout.parts * s.param.grad().numel();
  }
  if (size == 0) return;
  at::Tensor buffer = at::zeros({size}, slots.front().grad.options());
  for (const Slot& slot : slots) {
    buffer.narrow(0, slot.offset + slot.row * slot.grad.numel(), slot.grad.numel()).copy_(slot.grad.reshape({-1}));
  }
  group_.all_reduce(buffer, dist::ReduceOp::SUM).wait();
  for (Slot& slot : slots) {
    slot.grad.copy_(buffer.narrow(0, slot.offset + slot.row * slot.grad.numel(), slot.grad.numel())
                        .view(slot.grad.sizes()));
  }
}

double TensorParallel::clip_grad_norm(torch::nn::Module& root, double max_norm, const dist::Communicator* shard_group,
                                      const dist::Communicator* stages) const {
  // Each split parameter's share of its part: 1 / the ranks holding the part.
  std::map<const c10::TensorImpl*, double> split;
  for (const Split& s : split_) split[s.param.unsafeGetTensorImpl()] = share_of(s, group_.size());
  // [split, whole] sums of squares in float64 over this rank's gradients (data parallelism's shards of them).
  at::Tensor sums = at::zeros({2}, at::kDouble);
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : root.parameters()) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    auto it = split.find(p.unsafeGetTensorImpl());
    const at::Tensor squares = p.grad().to(at::kDouble).pow(2).sum();
    if (it == split.end()) {
      sums[1] += squares;
    } else {
      sums[0] += squares * it->second;
    }
  }
  const at::Device device = group_.size() > 1 ? group_.device() : at::Device(at::kCPU);
  sums = sums.to(shard_group != nullptr ? shard_group->device() : device);
  if (shard_group != nullptr) shard_group->all_reduce(sums, dist::ReduceOp::SUM).wait();
  // Whole parameters' gradients are the same on every rank of the group (reduce_gradients): counted once.
  at::Tensor split_sum = sums.narrow(0, 0, 1).to(device).clone();
  group_.all_reduce(split_sum, dist::ReduceOp::SUM).wait();
  at::Tensor total = split_sum + sums.narrow(0, 1, 1).to(device);
  if (stages != nullptr && stages->size() > 1) {  // every stage's (each tensor-parallel rank's pipeline alike)
    total = total.to(stages->device());
    stages->all_reduce(total, dist::ReduceOp::SUM).wait();
  }
  const double norm = std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    at::NoGradGuard no_grad;
    for (at::Tensor& g : grads) g.mul_(coefficient);
  }
  return norm;
}

const TensorParallel::Split* TensorParallel::split_of(const at::Tensor& param) const {
  for (const Split& s : split_) {
    if (s.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return &s;
  }
  return nullptr;
}

std::map<std::string, tp::SplitLayout> TensorParallel::split_layouts(const torch::nn::Module& root) const {
  std::map<std::string, tp::SplitLayout> out;
  for (const auto& p : root.named_parameters()) {
    if (const Split* s = split_of(p.value())) out[p.key()] = s->layout;
  }
  return out;
}

optim::TensorSplit TensorParallel::tensor_split() const {
  optim::TensorSplit out{group_, {}};
  for (const Split& s : split_) {
    out.params[s.param.unsafeGetTensorImpl()] = {s.layout.dim, s.extent, share_of(s, group_.size())};
  }
  return out;
}

TensorParallelizer::TensorParallelizer(const ModelRecipe& recipe, dist::Communicator group,
                                       TensorParallelOptions options)
    : flavor_(recipe.flavor()), group_(std::move(group)), options_(options), plan_(recipe.tp_plan()),
      matched_(plan_.size(), 0), held_(plan_.size()) {
  if (plan_.empty()) {
    throw std::invalid_argument("tensor parallelism: the " + recipe.family() + " family (" + flavor_ +
                                ") has no tensor-parallel plan");
  }
  if (options_.sequence_parallel && !splits_sequence(plan_)) {
    throw std::invalid_argument("sequence parallelism of " + flavor_ + ": the " + recipe.family() +
                                " family's plan has no embedding that splits the sequence among the ranks");
  }
}

void TensorParallelizer::split_modules(torch::nn::Module& subtree, const std::string& prefix, bool include_self) {
  const std::string& flavor = flavor_;
  const std::set<const torch::nn::Module*> adapters = lora_adapters(subtree);
  // Each module's rule (one at most), every module checked before any changes.
  std::vector<std::tuple<std::string, torch::nn::Module*, size_t>> todo;
  for (const auto& item : subtree.named_modules(prefix, include_self)) {
    if (done_.count(item.key()) || adapters.count(item.value().get())) continue;
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

TensorParallel TensorParallelizer::finish(torch::nn::Module& root) {
  // Whole parameters: what split_layer counted, and the rest of the model as it still is.
  for (const at::Tensor& p : root.parameters()) {
    if (counted_.insert(p.unsafeGetTensorImpl()).second) whole_parameters_ += p.numel();
  }
  split_modules(root, "", /*include_self=*/false);
  std::vector<std::string> lines;
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (matched_[i] == 0 && options_.pipeline_stage) continue;
    if (matched_[i] == 0) {
      throw std::invalid_argument("tensor parallelism of " + flavor_ + ": the plan's rule '" + plan_[i].module +
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
  return TensorParallelizer(*model.recipe, group, options).finish(*model.module);
}

}  // namespace shardtrain::models
