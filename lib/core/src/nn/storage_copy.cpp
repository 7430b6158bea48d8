#include "nn/storage_copy.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::nn {
namespace {

// The byte view of a tensor's whole storage.
at::Tensor storage_bytes(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  return at::empty({0}, t.options().dtype(at::kByte))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
}

// Makes `waiting` wait for what `stream` has been given so far.
void wait_for(const c10::Stream& stream, const c10::Stream& waiting) {
  c10::Event reached(stream.device_type());
  reached.record(stream);
  reached.block(waiting);
}

}  // namespace

c10::Stream CopyStream::side(const at::Device& device) {
  if (!side_ || side_->device() != device) {
    side_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  }
  return *side_;
}

StorageCopy CopyStream::to_host(const at::Tensor& t) {
  StorageCopy c;
  c.device = t.device();
  c.source = c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl());
  c.version = t._version();
  const at::Tensor bytes = storage_bytes(t);
  {
    const memory::CpuTierScope host_tier(memory::CpuTier::HOST);
    c.host = at::empty({bytes.numel()}, at::TensorOptions().dtype(at::kByte).pinned_memory(t.is_cuda()));
  }
  if (!t.is_cuda()) {
    c.host.copy_(bytes);
    return c;
  }
  const c10::impl::VirtualGuardImpl impl(t.device().type());
  const c10::Stream compute = impl.getStream(t.device()), copies = side(t.device());
  wait_for(compute, copies);  // the copy reads what compute wrote
  {
    const c10::StreamGuard on_side(copies);
    c.host.copy_(bytes, /*non_blocking=*/true);  // the pinned block is held until the side stream is past it
  }
  impl.recordDataPtrOnStream(t.storage().data_ptr(), copies);  // not reused before the copy has read it
  return c;
}

void CopyStream::to_device(StorageCopy& c) {
  if (c.restored.defined()) return;
  {
    const memory::CpuTierScope compute_tier(memory::CpuTier::COMPUTE);
    c.restored = at::empty({c.host.numel()}, at::TensorOptions().dtype(at::kByte).device(c.device));
  }
  if (!c.device.is_cuda()) {
    c.restored.copy_(c.host);
    return;
  }
  const c10::impl::VirtualGuardImpl impl(c.device.type());
  const c10::Stream compute = impl.getStream(c.device), copies = side(c.device);
  wait_for(compute, copies);  // the block's earlier users on the compute stream are done with it
  {
    const c10::StreamGuard on_side(copies);
    c.restored.copy_(c.host, /*non_blocking=*/true);
  }
  impl.recordDataPtrOnStream(c.restored.storage().data_ptr(), copies);
  c.copied_back.emplace(c.device.type());
  c.copied_back->record(copies);
}

at::Tensor CopyStream::ready(StorageCopy& c) {
  to_device(c);
  if (c.copied_back) c.copied_back->block(c10::impl::VirtualGuardImpl(c.device.type()).getStream(c.device));
  return c.restored;
}

}  // namespace shardtrain::nn
