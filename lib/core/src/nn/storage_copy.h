// A tensor storage copied to host memory and back, for activation offloading (nn/activation_offload.h). Private to
// the nn layer.
//
// On a GPU the copies run on a side stream of their own, so that compute does not wait for them: a copy starts once
// the compute stream has reached the point where it was asked for (an event), the caching allocator is told the side
// stream uses the device memory involved (so it is not handed out again before the copy is done), and the compute
// stream waits for a copy back only where a tensor on it is used (ready()). The host copies are pinned. On the CPU
// the copies are plain, and the host copy is filed in the counting allocator's HOST tier (memory/memory_stats.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <optional>

namespace shardtrain::nn {

// One storage a call saved, in host memory, and on its device while backward needs it. Lives as long as a saved
// tensor on it does: like the storage it copies, it is freed (both copies) when backward has run the last node that
// saved it.
struct StorageCopy {
  at::Tensor host;      // uint8 [bytes]
  at::Tensor restored;  // uint8 [bytes] on the device, or undefined
  at::Device device = at::kCPU;
  // The storage copied, held weakly: it names the storage while forward saves (another tensor on it is the same
  // copy) and cannot be mistaken for a later storage at the same address.
  c10::weak_intrusive_ptr<c10::StorageImpl> source{c10::intrusive_ptr<c10::StorageImpl>()};
  uint32_t version = 0;  // the saving tensor's version when copied: an in-place change since makes a new copy
  std::optional<c10::Event> copied_back;  // on a GPU: recorded on the side stream after the copy to `restored`
};

// The side stream of one device (none on the CPU), made when first asked for.
class CopyStream {
 public:
  // A copy of `t`'s whole storage in host memory, started.
  StorageCopy to_host(const at::Tensor& t);
  // Starts the copy back to the device (a fresh allocation there), unless it is there already.
  void to_device(StorageCopy& c);
  // The copy on the device, the current stream made to wait for its copy back.
  at::Tensor ready(StorageCopy& c);

 private:
  c10::Stream side(const at::Device& device);
  std::optional<c10::Stream> side_;
};

}  // namespace shardtrain::nn
