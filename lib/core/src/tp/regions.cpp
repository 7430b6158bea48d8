#include "shardtrain/tp/regions.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <stdexcept>
#include <string>

namespace shardtrain::tp {

namespace {

// What one side of a region does to a tensor; each function's backward is another of these.
enum class Op { IDENTITY, ALL_REDUCE, GATHER, REDUCE_SCATTER, SPLIT };

const char* op_name(Op op) {
  switch (op) {
    case Op::IDENTITY: return "copy_to_group";
    case Op::ALL_REDUCE: return "reduce_from_group";
    case Op::GATHER: return "gather_along";
    case Op::REDUCE_SCATTER: return "reduce_scatter_along";
    case Op::SPLIT: return "split_along";
  }
  return "?";
}

int64_t chunk_of(const at::Tensor& x, int64_t dim, const dist::Communicator& group, Op op) {
  const int64_t size = x.size(dim), ranks = group.size();
  if (size % ranks != 0) {
    throw std::invalid_argument(std::string("tp::") + op_name(op) + ": dimension " + std::to_string(dim) + " of " +
                                c10::str(x.sizes()) + " is " + std::to_string(size) +
                                ", which does not divide into the tensor-parallel group's " + std::to_string(ranks) +
                                " ranks");
  }
  return size / ranks;
}

// The op's result, no autograd. x is detached.
at::Tensor run(Op op, const at::Tensor& x, int64_t dim, const dist::Communicator& group) {
  const int64_t ranks = group.size();
  switch (op) {
    case Op::IDENTITY:
      return x;
    case Op::ALL_REDUCE: {
      at::Tensor out = x.contiguous().clone();
      group.all_reduce(out, dist::ReduceOp::SUM).wait();
      return out;
    }
    case Op::GATHER: {
      // Chunks travel in rank order along the first dimension: dim moved there and back.
      const at::Tensor first = x.movedim(dim, 0).contiguous();
      std::vector<int64_t> shape = first.sizes().vec();
      shape[0] *= ranks;
      at::Tensor gathered = at::empty(shape, x.options());
      group.all_gather(gathered, first).wait();
      return dim == 0 ? gathered : gathered.movedim(0, dim).contiguous();
    }
    case Op::REDUCE_SCATTER: {
      const int64_t n = chunk_of(x, dim, group, op);
      const at::Tensor first = x.movedim(dim, 0).contiguous();
      std::vector<int64_t> shape = first.sizes().vec();
      shape[0] = n;
      at::Tensor mine = at::empty(shape, x.options());
      group.reduce_scatter(mine, first, dist::ReduceOp::SUM).wait();
      return dim == 0 ? mine : mine.movedim(0, dim).contiguous();
    }
    case Op::SPLIT: {
      const int64_t n = chunk_of(x, dim, group, op);
      return x.narrow(dim, group.rank() * n, n).contiguous();
    }
  }
  throw std::logic_error("tp: unknown op");
}

class RegionBackward : public torch::autograd::Node {
 public:
  RegionBackward(Op op, int64_t dim, dist::Communicator group) : op_(op), dim_(dim), group_(std::move(group)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::NoGradGuard no_grad;
    return {run(op_, grads[0], dim_, group_)};
  }
  std::string name() const override { return std::string("shardtrain::tp::") + op_name(op_) + "Backward"; }

 private:
  Op op_;
  int64_t dim_;
  dist::Communicator group_;
};

at::Tensor region(Op forward, Op backward, const at::Tensor& x, int64_t dim, const dist::Communicator& group) {
  if (group.size() == 1) return x;
  dim = x.dim() > 0 ? c10::maybe_wrap_dim(dim, x.dim()) : 0;
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    // The identity's output is a tensor of its own (a detached alias), so that its history is this node's.
    out = run(forward, x.detach(), dim, group);
  }
  if (at::GradMode::is_enabled() && x.requires_grad()) {
    auto node = std::shared_ptr<RegionBackward>(new RegionBackward(backward, dim, group), torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(out, node);
  }
  return out;
}

}  // namespace

at::Tensor copy_to_group(const at::Tensor& x, const dist::Communicator& group) {
  return region(Op::IDENTITY, Op::ALL_REDUCE, x, 0, group);
}

at::Tensor reduce_from_group(const at::Tensor& x, const dist::Communicator& group) {
  return region(Op::ALL_REDUCE, Op::IDENTITY, x, 0, group);
}

at::Tensor gather_along(const at::Tensor& x, int64_t dim, const dist::Communicator& group) {
  return region(Op::GATHER, Op::REDUCE_SCATTER, x, dim, group);
}

at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const dist::Communicator& group) {
  return region(Op::REDUCE_SCATTER, Op::GATHER, x, dim, group);
}

at::Tensor split_along(const at::Tensor& x, int64_t dim, const dist::Communicator& group) {
  return region(Op::SPLIT, Op::GATHER, x, dim, group);
}

}  // namespace shardtrain::tp
