#include "fsdp/collectives.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

namespace shardtrain::fsdp {

AllGatherResult foreach_all_gather(const at::Tensor& sharded_flat, int64_t shard_version, at::ScalarType dtype,
                                   const at::Device& device, bool offloaded, const dist::Communicator& group) {
  const at::Tensor send = sharded_flat.to(device, dtype, /*non_blocking=*/true, /*copy=*/offloaded);
  AllGatherResult r;
  r.gathered = at::empty({group.size() * send.numel()}, send.options());
  r.work = group.all_gather(r.gathered, send);
  r.shard_version = shard_version;
  return r;
}

ByteLayout byte_layout(const std::vector<FsdpParam>& params) {
  constexpr int64_t kAlign = 16;
  ByteLayout layout;
  for (const FsdpParam& p : params) {
    layout.offsets.push_back(layout.block);
    const int64_t bytes = p.shard_numel() * static_cast<int64_t>(c10::elementSize(p.gather_dtype()));
    layout.block += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  return layout;
}

AllGatherResult foreach_all_gather_bytes(const at::Tensor& sharded_flat, int64_t shard_version, at::ScalarType dtype,
                                         const at::Device& device, bool offloaded, const dist::Communicator& group,
                                         const std::vector<FsdpParam>& params, const std::vector<int64_t>& offsets,
                                         const ByteLayout& layout) {
  const at::Tensor shards = sharded_flat.to(device, dtype, /*non_blocking=*/true, /*copy=*/offloaded);
  const at::Tensor send = at::empty({layout.block}, shards.options().dtype(at::kByte));
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].shard_numel();
    const at::Tensor shard = shards.narrow(0, offsets[i], n);
    const at::ScalarType to = params[i].gather_dtype();
    const at::Tensor slot = send.narrow(0, layout.offsets[i], n * static_cast<int64_t>(c10::elementSize(to)));
    slot.view(to).copy_(params[i].in_float8() ? nn::cast_to_float8(shard, params[i].float8_scale(), to) : shard);
  }
  AllGatherResult r;
  r.gathered = at::empty({group.size() * layout.block}, send.options());
  r.work = group.all_gather(r.gathered, send);
  r.shard_version = shard_version;
  r.bytes = layout;
  return r;
}

void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FsdpParam>& params,
                                 const std::vector<int64_t>& offsets, int64_t shard_numel) {
  result.work.wait();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].alloc_unsharded();
    if (result.bytes) {
      params[i].copy_in_unsharded_bytes(result.gathered, result.bytes->block, result.bytes->offsets[i]);
    } else {
      params[i].copy_in_unsharded(result.gathered, shard_numel, offsets[i]);
    }
    params[i].use_unsharded();
  }
}

ReduceScatterResult foreach_reduce_scatter(std::vector<at::Tensor>& full_grads, const std::vector<FsdpParam>& params,
                                           at::ScalarType dtype, const at::Device& device, dist::ReduceOp op,
                                           const dist::Communicator& group, const at::Tensor& agreed) {
  RECORD_USER_SCOPE("FSDP::reduce_scatter");  // copy-in and the collective's start
  ReduceScatterResult r;
  const float* any_rank = agreed.defined() ? agreed.data_ptr<float>() : nullptr;
  int64_t shard_numel = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool takes_part = params[i].param().requires_grad() && (!any_rank || any_rank[i] != 0.0f);
    r.offsets.push_back(takes_part ? shard_numel : -1);
    if (takes_part) shard_numel += params[i].shard_numel();
  }
  const bool group_of_one = group.size() == 1;
  // Every slot is written below (a gradient, its padding or zeros), so the buffer starts uninitialised: zeroing
  // it first was a second pass over a unit's full gradients.
  at::Tensor input = at::empty({(group_of_one ? 1 : group.size()) * shard_numel},
                               at::TensorOptions().dtype(dtype).device(device));
  std::vector<float> local_flags(params.size(), 0.0f);
  for (size_t i = 0; i < params.size(); ++i) {
    if (r.offsets[i] < 0) continue;
    if (!full_grads[i].defined()) {
      params[i].zero_grad_slots(input, shard_numel, r.offsets[i]);
      continue;
    }
    params[i].copy_grad_out(full_grads[i], input, shard_numel, r.offsets[i]);
    full_grads[i] = at::Tensor();
    local_flags[i] = 1.0f;
  }
  if (agreed.defined()) {
    r.has_gradient = agreed;
    r.has_gradient_agreed = true;
  } else {
    r.has_gradient = at::tensor(local_flags).to(group.device());  // NCCL reduces CUDA tensors only
  }
  if (group_of_one) {
    r.output = std::move(input);
    r.work = dist::Work();
  } else {
    r.output = at::empty({shard_numel}, input.options());
    r.work = group.reduce_scatter(r.output, input, op);
  }
  return r;
}

}  // namespace shardtrain::fsdp
