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

void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FsdpParam>& params,
                                 const std::vector<int64_t>& offsets, int64_t shard_numel) {
  result.work.wait();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].alloc_unsharded();
    params[i].copy_in_unsharded(result.gathered, shard_numel, offsets[i]);
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
