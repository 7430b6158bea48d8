// The communication of tensor parallelism as differentiable functions over one tensor-parallel group (Megatron-LM's
// mappings; what DTensor's redistributions between Replicate, Partial and Shard(dim) do in PyTorch):
//
//   function                   forward                           backward
//   copy_to_group(x)           identity (x replicated)           all-reduce (sum) of the ranks' partial gradients
//   reduce_from_group(x)       all-reduce (sum) of partial sums  identity
//   gather_along(x, dim)       all-gather, rank r's chunk at r   reduce-scatter (sum): this rank's chunk
//   reduce_scatter_along(x, d) reduce-scatter (sum) of partials  all-gather
//
// A column-parallel projection takes its input through copy_to_group (each rank uses the whole input for its part
// of the output, so the input's gradient is the sum of the ranks'); a row-parallel one returns its partial product
// through reduce_from_group. With sequence parallelism the activations between them are sharded on the sequence
// dimension: gather_along replaces copy_to_group and reduce_scatter_along replaces reduce_from_group, the same bytes
// on the wire as the all-reduce they split (Korthikanti et al. 2022).
//
// Chunks along `dim` are equal: its size (gathered: the group size times the local size) divides by the group
// size, else std::invalid_argument naming the sizes. Every rank of the group calls in the same order. A group of
// one is the identity.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::tp {

at::Tensor copy_to_group(const at::Tensor& x, const dist::Communicator& group);
at::Tensor reduce_from_group(const at::Tensor& x, const dist::Communicator& group);
// x (..., n, ...) with n at dim -> (..., group.size() * n, ...).
at::Tensor gather_along(const at::Tensor& x, int64_t dim, const dist::Communicator& group);
// x (..., group.size() * n, ...) -> this rank's (..., n, ...).
at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const dist::Communicator& group);
// This rank's chunk of a replicated x along dim, without communication; its gradient all-gathered in backward.
at::Tensor split_along(const at::Tensor& x, int64_t dim, const dist::Communicator& group);

}  // namespace shardtrain::tp
