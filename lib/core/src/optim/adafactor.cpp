#include "shardtrain/optim/adafactor.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "optim/closure.h"

namespace shardtrain::optim {
namespace {

void check(bool ok, const char* what, double value, const char* expected) {
  if (!ok) {
    throw std::invalid_argument(std::string("Adafactor: ") + what + " " + std::to_string(value) + " is not " + expected);
  }
}

void check_options(const AdafactorOptions& o) {
  check(o.lr() >= 0, "lr", o.lr(), "0 or positive");
  check(o.eps1() >= 0, "eps1", o.eps1(), "0 or positive");
  check(o.eps2() >= 0, "eps2", o.eps2(), "0 or positive");
  check(o.clip_threshold() > 0, "clip_threshold", o.clip_threshold(), "positive");
  check(o.decay_rate() < 0, "decay_rate", o.decay_rate(), "negative (the decay at step t is 1 - t^decay_rate)");
  check(o.beta1() >= 0 && o.beta1() < 1, "beta1", o.beta1(), "in [0, 1)");
  check(o.weight_decay() >= 0, "weight_decay", o.weight_decay(), "0 or positive");
  if (o.warmup_init() && !o.relative_step()) {
    throw std::invalid_argument("Adafactor: warmup_init needs relative_step (it warms the relative step up)");
  }
}

// Sums of float32 pieces across ranks: each piece over the shard group (FSDP's rows), the tensor-parallel group
// (the slices), or both (the shard group's sum, times the piece's share, then over the tensor-parallel group): one
// all-reduce per group for every piece together. A piece's place is its offset into the buffer.
class GroupSums {
 public:
  enum Over { SHARD = 1, TENSOR = 2, BOTH = 3 };
  int64_t add(at::Tensor piece, Over over, double share = 1) {
    const int64_t at = size_;
    size_ += piece.numel();
    pieces_.push_back({piece.reshape({-1}), over, share, at});
    return at;
  }
  void reduce(const std::optional<RowSharding>& shards, const std::optional<TensorSplit>& slices) {
    if (pieces_.empty()) return;
    std::vector<at::Tensor> all;
    for (const Piece& p : pieces_) all.push_back(p.values);
    sums_ = at::cat(all);
    if (shards && shards->group.size() > 1) over_group(shards->group, SHARD, false);
    if (slices && slices->group.size() > 1) over_group(slices->group, TENSOR, true);
    pieces_.clear();
    host_ = sums_.to(at::kCPU).to(at::kDouble);  // one copy for every scalar read
  }
  at::Tensor slice(int64_t at, int64_t n) const { return sums_.narrow(0, at, n); }
  double value(int64_t at) const { return host_.data_ptr<double>()[at]; }

 private:
  struct Piece {
    at::Tensor values;
    Over over;
    double share;
    int64_t at;
  };
  // The pieces summed over `group`, in place in sums_ (scaled by their shares first when `shared`).
  void over_group(const dist::Communicator& group, Over which, bool shared) {
    std::vector<at::Tensor> mine;
    for (const Piece& p : pieces_) {
      if (!(p.over & which)) continue;
      const at::Tensor v = sums_.narrow(0, p.at, p.values.numel());
      mine.push_back(shared && p.share != 1 ? v * p.share : v);
    }
    if (mine.empty()) return;
    at::Tensor wire = at::cat(mine).to(group.device());
    group.all_reduce(wire, dist::ReduceOp::SUM).wait();
    wire = wire.to(sums_.device());
    int64_t offset = 0;
    for (const Piece& p : pieces_) {
      if (!(p.over & which)) continue;
      sums_.narrow(0, p.at, p.values.numel()).copy_(wire.narrow(0, offset, p.values.numel()));
      offset += p.values.numel();
    }
  }
  std::vector<Piece> pieces_;
  at::Tensor sums_, host_;
  int64_t size_ = 0;
};

}  // namespace

// One parameter's step from the first all-reduce (sums of squares, column sums) to the second (the update's RMS).
struct Adafactor::Pending {
  at::Tensor param;  // the parameter's real rows (all of it when whole)
  at::Tensor grad;   // float32, the same rows
  AdafactorParamState* state = nullptr;
  const AdafactorOptions* options = nullptr;
  int64_t full_rows = 1;    // the whole parameter's dim 0
  double full_numel = 0;    // the whole parameter's elements
  double beta2t = 0;        // this step's second-moment decay
  bool matrix = false;      // 2 dimensions: column statistics and the row-statistics mean need the whole matrix
  std::optional<TensorSplit::Split> slice;  // how tensor parallelism split it (none: whole on the group)
  int64_t param_sq_at = -1, col_sum_at = -1, row_sum_at = -1, update_sq_at = -1;  // offsets into the sums
  // Columns split: this rank's columns' part of each row's sum of squares, and beta2t x the previous row
  // statistics' sum (row_sum_at then holds the new part of the new statistics' sum).
  int64_t row_sq_at = -1, row_before_at = -1;
  double row_mean = 0;      // a matrix's mean row statistic (after the all-reduce)

  // Where a sum over the whole parameter is taken: its shard group's rows, and its tensor-parallel slices.
  GroupSums::Over whole() const { return slice ? GroupSums::BOTH : GroupSums::SHARD; }
  double share() const { return slice ? slice->share : 1.0; }

  // The real rows of a state tensor split by rows (a scalar parameter's as one row).
  at::Tensor rows_of(const at::Tensor& t) const {
    return t.dim() == 0 ? t.view({1}) : t.narrow(0, 0, std::min(t.size(0), param.size(0)));
  }

  // The unclipped update: the gradient over the square root of its second-moment estimate.
  at::Tensor update() const {
    if (state->exp_avg_sq().defined()) return rows_of(state->exp_avg_sq()).rsqrt().mul_(grad);
    const at::Tensor row = rows_of(state->exp_avg_sq_row());
    const at::Tensor col = matrix ? state->exp_avg_sq_col() : rows_of(state->exp_avg_sq_col());
    const at::Tensor r = matrix ? (row / row_mean).rsqrt_() : (row / row.mean(-1, /*keepdim=*/true)).rsqrt_();
    return r.unsqueeze(-1).mul(col.unsqueeze(-2).rsqrt()).mul_(grad);
  }
};

AdafactorOptions::AdafactorOptions(double lr) : lr_(lr) {}

Adafactor::Adafactor(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdafactorOptions defaults,
                     std::optional<RowSharding> sharding, std::optional<TensorSplit> tensor_split)
    : torch::optim::Optimizer(param_groups, std::make_unique<AdafactorOptions>(defaults)),
      sharding_(std::move(sharding)), tensor_split_(std::move(tensor_split)) {
  for (const auto& group : this->param_groups()) check_options(static_cast<const AdafactorOptions&>(group.options()));
}

AdafactorParamState& Adafactor::new_state(const at::Tensor& param, const AdafactorOptions& o, int64_t step) {
  const auto f32 = param.options().dtype(at::kFloat);
  auto s = std::make_unique<AdafactorParamState>();
  s->step(step);
  if (o.beta1() > 0) s->exp_avg(at::zeros(param.sizes(), f32));
  if (param.dim() >= 2) {
    std::vector<int64_t> row = param.sizes().vec(), col = param.sizes().vec();
    row.pop_back();
    col.erase(col.end() - 2);
    s->exp_avg_sq_row(at::zeros(row, f32));
    s->exp_avg_sq_col(at::zeros(col, f32));
  } else {
    s->exp_avg_sq(at::zeros(param.sizes(), f32));
  }
  auto& slot = state_[param.unsafeGetTensorImpl()];
  slot = std::move(s);
  return static_cast<AdafactorParamState&>(*slot);
}

AdafactorParamState& Adafactor::empty_state(const at::Tensor& param, int64_t step) {
  for (const auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      if (p.is_same(param)) return new_state(param, static_cast<const AdafactorOptions&>(group.options()), step);
    }
  }
  return new_state(param, static_cast<const AdafactorOptions&>(defaults()), step);
}

// transformers' step, reordered so that what spans a whole sharded parameter is summed across the shard group in
// two all-reduces for every parameter at once:
//   1. locally: step count, the decay beta2t = 1 - t^decay_rate, the squared gradient + eps1; the row statistics
//      (means over the last dimension, whole on each rank) and full second moments take their running means;
//      queued for the sum: the parameter's sum of squares, a matrix's column sums and the sum of its new row
//      statistics.
//   2. after the sum: the column statistics' running means, the update, its sum of squares queued.
//   3. after the second sum: the update clipped to RMS clip_threshold, times the learning rate, through the first
//      moment, weight decay, and applied.
at::Tensor Adafactor::step(LossClosure closure) {
  const at::Tensor loss = evaluate_closure(closure);
  c10::AutoGradMode no_grad(false);
  std::vector<Pending> pending;
  GroupSums first;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const AdafactorOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().is_sparse()) throw std::invalid_argument("Adafactor does not take sparse gradients");
      auto it = state_.find(p.unsafeGetTensorImpl());
      Pending u;
      u.state = it == state_.end() ? &new_state(p, o, 0) : static_cast<AdafactorParamState*>(it->second.get());
      u.options = &o;
      u.param = p.dim() == 0 ? p.detach().view({1}) : p.detach();
      u.grad = p.grad().dim() == 0 ? p.grad().view({1}) : p.grad();
      u.full_rows = u.param.size(0);
      const int64_t row_numel = u.param.size(0) > 0 ? u.param.numel() / u.param.size(0) : 0;
      if (sharding_) {
        auto split = sharding_->params.find(p.unsafeGetTensorImpl());
        if (split != sharding_->params.end()) {
          u.full_rows = split->second.full_rows;
          u.param = u.param.narrow(0, 0, split->second.real_rows);
          u.grad = u.grad.narrow(0, 0, split->second.real_rows);
        }
      }
      u.full_numel = static_cast<double>(u.full_rows * row_numel);
      if (tensor_split_) {
        auto split = tensor_split_->params.find(p.unsafeGetTensorImpl());
        if (split != tensor_split_->params.end()) {
          if (p.dim() > 2 || split->second.dim >= std::max<int64_t>(p.dim(), 1)) {
            throw std::invalid_argument("Adafactor: a tensor-parallel parameter of shape " + c10::str(p.sizes()) +
                                        " split on dim " + std::to_string(split->second.dim) +
                                        "; vectors and matrices split on their rows or columns are stepped");
          }
          u.slice = split->second;
          const int64_t extent = u.slice->extent;
          if (u.slice->dim == 0) u.full_rows = extent;
          u.full_numel = static_cast<double>(u.slice->dim == 0 ? extent * row_numel : u.full_rows * extent);
        }
      }
      u.grad = u.grad.to(at::kFloat);
      u.matrix = p.dim() == 2;
      AdafactorParamState& s = *u.state;
      s.step(s.step() + 1);
      u.beta2t = 1.0 - std::pow(static_cast<double>(s.step()), o.decay_rate());
      const at::Tensor sq = u.grad.square().add_(o.eps1());
      if (o.scale_parameter()) u.param_sq_at = first.add(u.param.to(at::kFloat).square().sum(), u.whole(), u.share());
      if (s.exp_avg_sq().defined()) {
        u.rows_of(s.exp_avg_sq()).mul_(u.beta2t).add_(sq, 1.0 - u.beta2t);
      } else if (u.slice && u.slice->dim == 1) {
        // A row's statistic is the mean over every rank's columns: its new value waits for the group's sum; the
        // mean of them all is the old ones' (whole on the group) and the new part (a sum over both groups).
        const at::Tensor row = u.rows_of(s.exp_avg_sq_row());
        const double columns = static_cast<double>(u.slice->extent);
        u.row_sq_at = first.add(sq.sum(-1), GroupSums::TENSOR, u.share());
        u.row_before_at = first.add(row.sum() * u.beta2t, GroupSums::SHARD);
        u.row_sum_at = first.add(sq.sum() * ((1.0 - u.beta2t) / columns), GroupSums::BOTH, u.share());
        u.col_sum_at = first.add(sq.sum(0), GroupSums::SHARD);
      } else {
        const at::Tensor row = u.rows_of(s.exp_avg_sq_row());
        row.mul_(u.beta2t).add_(sq.mean(-1), 1.0 - u.beta2t);
        if (u.matrix) {
          u.col_sum_at = first.add(sq.sum(0), u.whole(), u.share());
          u.row_sum_at = first.add(row.sum(), u.whole(), u.share());
        } else {
          u.rows_of(s.exp_avg_sq_col()).mul_(u.beta2t).add_(sq.mean(-2), 1.0 - u.beta2t);
        }
      }
      pending.push_back(std::move(u));
    }
  }
  first.reduce(sharding_, tensor_split_);

  GroupSums second;
  for (Pending& u : pending) {
    if (u.matrix) {
      const double rows = static_cast<double>(u.full_rows);
      const at::Tensor col_mean = first.slice(u.col_sum_at, u.state->exp_avg_sq_col().numel()) / rows;
      u.state->exp_avg_sq_col().mul_(u.beta2t).add_(col_mean, 1.0 - u.beta2t);
      u.row_mean = first.value(u.row_sum_at) / rows;
      if (u.row_sq_at >= 0) {
        const at::Tensor row = u.rows_of(u.state->exp_avg_sq_row());
        const double columns = static_cast<double>(u.slice->extent);
        row.mul_(u.beta2t).add_(first.slice(u.row_sq_at, row.numel()) / columns, 1.0 - u.beta2t);
        u.row_mean += first.value(u.row_before_at) / rows;
      }
    }
    u.update_sq_at = second.add(u.update().square().sum(), u.whole(), u.share());
  }
  second.reduce(sharding_, tensor_split_);

  for (Pending& u : pending) {
    const AdafactorOptions& o = *u.options;
    const AdafactorParamState& s = *u.state;
    double lr = o.lr();
    if (o.relative_step()) {
      const double t = static_cast<double>(s.step());
      lr = std::min(o.warmup_init() ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
    }
    if (o.scale_parameter()) lr *= std::max(o.eps2(), std::sqrt(first.value(u.param_sq_at) / u.full_numel));
    const double update_rms = std::sqrt(second.value(u.update_sq_at) / u.full_numel);
    at::Tensor update = u.update().div_(std::max(update_rms / o.clip_threshold(), 1.0)).mul_(lr);
    if (o.beta1() > 0) update = u.rows_of(s.exp_avg()).mul_(o.beta1()).add_(update, 1.0 - o.beta1());
    at::Tensor value = u.param.scalar_type() == at::kFloat ? u.param : u.param.to(at::kFloat);
    if (o.weight_decay() != 0) value.mul_(1.0 - o.weight_decay() * lr);
    value.sub_(update);
    if (!value.is_same(u.param)) u.param.copy_(value);
  }
  return loss;
}

}  // namespace shardtrain::optim
