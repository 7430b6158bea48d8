// The collectives of one FSDP unit as stateless functions, in FSDP2's manner (its _fsdp_collectives.py): each
// takes everything it uses as arguments and returns what it started; the unit (fsdp_unit.h) decides when to call
// them and keeps what they return. Private to the fsdp layer.
//
// Layouts: a unit's flat shard is (S) elements, S = unit_shard_numel, the parameters' shards back to back at
// `offsets`; the all-gather output and the reduce-scatter input are rank-major (W * S): rank r's block is what
// rank r's flat shard holds (padding rows zero).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

#include "fsdp/fsdp_param.h"
#include "shardtrain/distributed/communicator.h"

namespace shardtrain::fsdp {

// Where each parameter sits in a rank's block of a gather of bytes (FsdpOptions::float8_all_gather: parameters of
// two dtypes in one collective): at `offsets` (bytes, multiples of 16 so that any dtype views them), shard_numel
// elements of its gather dtype; `block` bytes a rank.
struct ByteLayout {
  std::vector<int64_t> offsets;
  int64_t block = 0;
};
ByteLayout byte_layout(const std::vector<FsdpParam>& params);

// An all-gather in flight: `gathered` (W * S) in the compute dtype — or, with `bytes`, (W * bytes->block) uint8 —
// is valid after work.wait().
struct AllGatherResult {
  at::Tensor gathered;
  dist::Work work;
  int64_t shard_version = 0;  // the shards' version sum when issued: a changed sum means the optimizer stepped since
  std::optional<ByteLayout> bytes;
};

// Issues the all-gather of a unit's flat shard in `dtype` on `device` (mixed precision casts the shards first).
// `offloaded` shards are copied from host memory to `device` first — a copy even when the device is the CPU, as
// under a GPU — asynchronously and ordered before the collective.
AllGatherResult foreach_all_gather(const at::Tensor& sharded_flat, int64_t shard_version, at::ScalarType dtype,
                                   const at::Device& device, bool offloaded, const dist::Communicator& group);

// The same in bytes laid out as `layout` says: each parameter's shard (of sharded_flat at `offsets`) in `dtype`,
// then, for a parameter gathered in float8, cast to e4m3 with its scale (FsdpParam::float8_scale): the bytes of
// gathering in `dtype` and casting the full value, each element cast alike.
AllGatherResult foreach_all_gather_bytes(const at::Tensor& sharded_flat, int64_t shard_version, at::ScalarType dtype,
                                         const at::Device& device, bool offloaded, const dist::Communicator& group,
                                         const std::vector<FsdpParam>& params, const std::vector<int64_t>& offsets,
                                         const ByteLayout& layout);

// Waits for the all-gather and copies each parameter's rows into its unsharded storage (allocated here, in place,
// so that views autograd saved stay valid), then points the parameters at their full values.
void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FsdpParam>& params,
                                 const std::vector<int64_t>& offsets, int64_t shard_numel);

// A reduction in flight: `output` (G) in the reduce dtype, this rank's reduced rows of the parameters that take part
// (those requiring a gradient), back to back at `offsets` (-1: not reduced), valid after work->wait(); G <= S.
// `has_gradient` (params) 1.0 where this rank contributed a gradient, on the group's device.
struct ReduceScatterResult {
  at::Tensor output;
  std::vector<int64_t> offsets;
  at::Tensor has_gradient;
  bool has_gradient_agreed = false;  // has_gradient is already the MAX over the ranks (`agreed` was given)
  std::optional<dist::Work> work;  // until waited; an empty Work for a group of one, which communicates nothing
};

// Copies the full gradients (undefined: the parameter got none, counted as zero) into a new reduce-scatter input
// (W * G) in `dtype` on `device`, dropping each full gradient once copied (at most one full gradient and the input
// alive), and issues the reduce-scatter with `op`. Parameters that require no gradient take no room: a frozen
// parameter's rows would be reduced as zeros (FLAVA's frozen image codebook, half its root unit, would make that
// unit's reduction input twice the size). `agreed`, when defined, is the per-parameter MAX over the ranks of
// "has a gradient" (float, one per parameter, on the CPU): parameters no rank has a gradient for take no room
// either, and it becomes the result's has_gradient. A group of one communicates nothing: the input is the output.
ReduceScatterResult foreach_reduce_scatter(std::vector<at::Tensor>& full_grads, const std::vector<FsdpParam>& params,
                                           at::ScalarType dtype, const at::Device& device, dist::ReduceOp op,
                                           const dist::Communicator& group, const at::Tensor& agreed = {});

}  // namespace shardtrain::fsdp
