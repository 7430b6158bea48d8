// A tensor kept from forward to backward by one of the nn layer's own autograd nodes (activation checkpointing's
// inputs): on its device, or in host memory when it was kept while an offloaded call ran on this thread
// (nn/activation_offload.h). Private to the nn layer.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace shardtrain::nn {

class OffloadCall;
struct StorageCopy;

class SavedActivation {
 public:
  SavedActivation() = default;
  // Keeps `t` as a detached alias, or its storage's copy in host memory when an offloaded call is running on this
  // thread and `t` is an activation (not a parameter, a view or cast of one, or storage-less). Undefined stays
  // undefined.
  static SavedActivation keep(const at::Tensor& t);

  bool defined() const { return kept_.defined() || call_ != nullptr; }
  bool offloaded() const { return call_ != nullptr; }
  // The tensor as kept, on its device: an offloaded one is brought back (with its call's predecessor in forward,
  // prefetched). Throws std::logic_error when undefined.
  at::Tensor get() const;
  // Its version counter at keep() and now: they differ when it was modified in place since.
  uint32_t saved_version() const { return saved_version_; }
  uint32_t current_version() const;

 private:
  at::Tensor kept_;                    // on its device; undefined when offloaded
  std::shared_ptr<OffloadCall> call_;  // the call it was offloaded in
  std::shared_ptr<StorageCopy> copy_;  // its storage's copy (shared with the other tensors on that storage)
  // The view of the storage it was: element type, sizes, strides and offset in elements.
  at::ScalarType dtype_ = at::kFloat;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_ = 0;
  std::optional<c10::VariableVersion> version_;
  uint32_t saved_version_ = 0;
};

}  // namespace shardtrain::nn
