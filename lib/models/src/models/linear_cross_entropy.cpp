#include "shardtrain/models/losses.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "custom_nodes.h"

namespace shardtrain::models {

namespace {

// The loss is the end of the graph, so its gradients are known in forward: each chunk's logits become the loss's
// terms and their gradient (softmax minus the one-hot target, over the count) at once, and are dropped. Backward
// scales what forward computed by the incoming gradient.
// One chunk's log-probabilities of every class it holds, (n, V) float32 from its logits (n, V) float32 (consumed),
// and the log-probability of each row's target, (n), 0 where the row takes no loss. With the vocabulary split over
// a group, this rank's classes only: the row maxima and the sums of exponentials and target logits over the group
// (an all-reduce of n values, then one of 2n).
struct ChunkLogProbs {
  at::Tensor log_probs, target;
};

ChunkLogProbs chunk_log_probs(at::Tensor logits, const at::Tensor& target, const at::Tensor& keep,
                              const VocabShard* shard) {
  if (shard == nullptr) {
    at::Tensor log_probs = at::log_softmax(logits, 1);
    const at::Tensor safe = target.masked_fill(~keep, 0).unsqueeze(1);
    at::Tensor picked = log_probs.gather(1, safe).squeeze(1) * keep;
    return {std::move(log_probs), std::move(picked)};
  }
  const dist::Communicator& group = shard->group;
  at::Tensor row_max = std::get<0>(logits.max(1));
  group.all_reduce(row_max, dist::ReduceOp::MAX).wait();
  logits.sub_(row_max.unsqueeze(1));
  const at::Tensor local = target - shard->start;
  const at::Tensor mine = keep & (local >= 0) & (local < logits.size(1));
  const at::Tensor picked = logits.gather(1, local.masked_fill(~mine, 0).unsqueeze(1)).squeeze(1) * mine;
  at::Tensor sums = at::stack({logits.exp().sum(1), picked});  // (2, n)
  group.all_reduce(sums, dist::ReduceOp::SUM).wait();
  const at::Tensor log_z = sums[0].log();
  logits.sub_(log_z.unsqueeze(1));
  return {std::move(logits), (sums[1] - log_z) * keep};
}

// The loss is the end of the graph, so its gradients are known in forward: each chunk's logits become the loss's
// terms and their gradient (softmax minus the one-hot target, over the count) at once, and are dropped. Backward
// scales what forward computed by the incoming gradient.
struct LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
  // hidden (K, C), weight (V, C), bias (V) or none (optional_input), labels (K) int64 in [0, V) or kIgnoreIndex;
  // shard: the slice of the vocabulary weight holds, or null for all of it. Returns ().
  // grads: gradients wanted at all (grad mode was on at the call; inside forward it is always off).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const std::optional<at::Tensor>& maybe_bias, const at::Tensor& labels, bool grads,
                            const VocabShard* shard) {
    const at::Tensor bias = maybe_bias.value_or(at::Tensor());
    const int64_t rows = hidden.size(0), vocab = weight.size(0), step = linear_cross_entropy_chunk_rows(vocab);
    const at::Tensor counted = labels != kIgnoreIndex;
    // The mean is over the labelled rows (masked_cross_entropy's); none: NaN, as there.
    const double count = static_cast<double>(counted.sum().item<int64_t>());
    // No zero fills (a 32k x 512 float32 weight's is 17 ms here): hidden's gradient is written row by row, the
    // weight's and bias's by the first chunk, then accumulated.
    at::Tensor grad_hidden = grads && hidden.requires_grad() ? at::empty_like(hidden) : at::Tensor();
    at::Tensor grad_weight = grads && weight.requires_grad()
                                 ? at::empty(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    at::Tensor grad_bias = grads && bias.defined() && bias.requires_grad()
                               ? at::empty(bias.sizes(), bias.options().dtype(at::kFloat)) : at::Tensor();
    if (rows == 0) {  // no chunk writes them
      if (grad_weight.defined()) grad_weight.zero_();
      if (grad_bias.defined()) grad_bias.zero_();
    }
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    for (int64_t start = 0; start < rows; start += step) {
      const int64_t n = std::min(step, rows - start);
      const at::Tensor h = hidden.narrow(0, start, n);
      const at::Tensor target = labels.narrow(0, start, n), keep = counted.narrow(0, start, n);
      // (n, V) float32 like the loss's cast; the compute-dtype logits go before log-softmax runs, the float32
      // ones after (at most two float32 copies of a chunk at once: activation_model's linear_cross_entropy_bytes).
      // Its own statement: a temporary in the call's arguments would keep the compute-dtype logits alive through it.
      at::Tensor logits = at::linear(h, weight, bias).to(at::kFloat);
      ChunkLogProbs chunk = chunk_log_probs(std::move(logits), target, keep, shard);
      total -= chunk.target.sum();
      if (!grads) continue;
      // d loss / d logits = (softmax - one_hot) / count on labelled rows, 0 elsewhere; in the logits' own dtype
      // for the products, as autograd would cast it back. Split, the one-hot is this rank's classes'.
      at::Tensor grad = std::move(chunk.log_probs).exp_();
      const at::Tensor local = shard == nullptr ? target : target - shard->start;
      const at::Tensor hit = keep & (local >= 0) & (local < grad.size(1));
      grad.scatter_add_(1, local.masked_fill(~hit, 0).unsqueeze(1), -hit.to(at::kFloat).unsqueeze(1));
      grad.mul_((keep.to(at::kFloat) / count).unsqueeze(1));
      const at::Tensor grad_c = grad.to(hidden.scalar_type());
      if (grad_hidden.defined()) {
        at::Tensor slice = grad_hidden.narrow(0, start, n);  // rows of a contiguous tensor: contiguous
        at::mm_out(slice, grad_c, weight);
      }
      if (grad_weight.defined()) {
        // The weight's gradient sums in float32 over the rounded chunk gradient: rounded in place, no copy.
        if (grad_c.scalar_type() != at::kFloat) grad.copy_(grad_c);
        const at::Tensor b = h.to(at::kFloat);
        start == 0 ? at::mm_out(grad_weight, grad.t(), b) : grad_weight.addmm_(grad.t(), b);
      }
      if (grad_bias.defined()) start == 0 ? at::sum_out(grad_bias, grad, 0) : grad_bias.add_(grad.sum(0));
    }
    ctx->saved_data["grad_hidden"] = grad_hidden;
    ctx->saved_data["grad_weight"] = grad_weight.defined() ? grad_weight.to(weight.scalar_type()) : grad_weight;
    ctx->saved_data["grad_bias"] = grad_bias.defined() ? grad_bias.to(bias.scalar_type()) : grad_bias;
    return total / count;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor& g = grad_outputs[0];  // () d(whatever follows) / d loss
    // Scaled in place and handed over: no second gradient-sized copy (the weight's is the LM head's size).
    auto scaled = [&](const char* name) {
      auto it = ctx->saved_data.find(name);
      if (it == ctx->saved_data.end()) {
        throw std::logic_error("linear_cross_entropy: backward ran twice over one forward (retain_graph)");
      }
      at::Tensor t = it->second.toTensor();
      ctx->saved_data.erase(it);
      return t.defined() ? t.mul_(g.to(t.scalar_type())) : t;
    };
    return {scaled("grad_hidden"), scaled("grad_weight"), scaled("grad_bias"), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// 8M float32 logits (32 MB) at a time: at 1024 rows x 512 x 32000 on one and two threads, 262-row chunks took
// 0.83-0.86x the time of the unfused linear + cross-entropy + backward, 131-row ones 0.92-0.97x (2026-11-24).
int64_t linear_cross_entropy_chunk_rows(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t{1} << 23) / std::max<int64_t>(1, vocab));
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& labels, const VocabShard* shard) {
  if (hidden.dim() != 2 || weight.dim() != 2 || hidden.size(1) != weight.size(1) || labels.dim() != 1 ||
      labels.size(0) != hidden.size(0)) {
    throw std::invalid_argument("linear_cross_entropy: expected hidden (K, C), weight (V, C) and labels (K), got " +
                                c10::str(hidden.sizes()) + ", " + c10::str(weight.sizes()) + " and " +
                                c10::str(labels.sizes()));
  }
  if (shard != nullptr && shard->group.size() == 1) shard = nullptr;
  return LinearCrossEntropy::apply(hidden, weight, optional_input(bias), labels, at::GradMode::is_enabled(), shard);
}

}  // namespace shardtrain::models
