// replicate: distributed data parallelism (PyTorch's DistributedDataParallel) for LibTorch modules.
//
//   auto ddp = ddp::replicate(model.ptr(), pg.world());   // parameters and buffers now equal rank 0's
//   loss_fn(model(x_local)).backward();                    // gradients averaged over the group during backward
//   optimizer.step();
//
// Every rank holds the whole model. Gradients are grouped into buckets of about bucket_cap_mb, in the reverse of
// parameter order (the order backward produces them); a bucket is all-reduced (mean) as soon as its last gradient
// is accumulated, while backward goes on, and buckets start in the same order on every rank; two are in flight at
// most, an earlier one waited for when a third starts. The averaged gradients are written back into .grad as each
// bucket completes (or, with gradient_as_bucket_view, already are .grad); .grad holds the mean once backward
// returns. A group of one communicates nothing and allocates no bucket: its gradients are their own mean.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace torch::nn {
class Module;
}

namespace shardtrain::ddp {

struct DdpOptions {
  double bucket_cap_mb = 25.0;  // bytes of gradients per bucket, in MiB (PyTorch's default)
  // false: a parameter that received no gradient in a backward is an error naming it (a model whose forward
  // skips parameters would hang or diverge otherwise). true (PyTorch's find_unused_parameters): one more small
  // all-reduce per backward finds which parameters some rank used; those get the mean (zero from the ranks that
  // did not use them), and those no rank used keep their gradient as it was — none after zero_grad, so an optimizer
  // leaves them alone, as with PyTorch's DDP and with fully_shard.
  bool find_unused_parameters = false;
  // Buffers are copied from rank 0 before every forward (needs a module deriving from nn::Interceptable; others
  // get them at replicate() only).
  bool broadcast_buffers = true;
  // true: each bucket is allocated once and every .grad aliases its slot in it (PyTorch's gradient_as_bucket_view):
  // AccumulateGrad adds into the bucket, the all-reduce runs on it in place, and the averaged values are the
  // gradients — no per-backward bucket and no copies in or out, one gradient-sized buffer less at the peak. A
  // gradient that is not its slot's alias (the first backward, or after zero_grad() set it to none) is copied in
  // once when ready. Gradients alias their buckets for the model's life.
  bool gradient_as_bucket_view = false;
};

class Ddp {
 public:
  struct Impl;
  explicit Ddp(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  // false: backward leaves the local gradients in .grad, accumulating, and communicates nothing; the next backward
  // with sync on averages the accumulated sum (PyTorch's no_sync).
  void set_requires_gradient_sync(bool sync);
  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> buckets() const;
  int64_t all_reduces() const;  // bucket all-reduces issued so far (none in a group of one)

 private:
  std::shared_ptr<Impl> impl_;
};

// Broadcasts `module`'s parameters and buffers from the group's rank 0 and installs the gradient hooks. Collective.
// A module deriving from nn::Interceptable owns its replication from then on; for any other module the returned
// handle must live as long as the module trains (as PyTorch's DDP wrapper does). Throws std::invalid_argument for
// a non-positive bucket size. Apply once per module.
Ddp replicate(const std::shared_ptr<torch::nn::Module>& module, const dist::Communicator& group,
              const DdpOptions& options = {});

// Gradient accumulation without communication for the guard's lifetime.
class NoSync {
 public:
  explicit NoSync(Ddp ddp) : ddp_(std::move(ddp)) { ddp_.set_requires_gradient_sync(false); }
  ~NoSync() { ddp_.set_requires_gradient_sync(true); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  Ddp ddp_;
};

}  // namespace shardtrain::ddp
