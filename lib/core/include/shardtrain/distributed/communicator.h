// One communicator interface over c10d backends: Gloo on CPU, NCCL on CUDA, and a size-1 group that needs no
// backend at all. Every operation is asynchronous and returns a Work; its results may be read only after wait().
//
// Conventions (n = elements per rank, W = size()):
//   all_gather     out (W*n) <- in (n) of every rank, rank r's at [r*n, (r+1)*n)
//   reduce_scatter out (n)   <- reduction over ranks of in (W*n) at [rank*n, (rank+1)*n)
//   all_to_all     out (W*n) chunk j <- chunk rank of rank j's in (W*n)
// Tensors are flat (any shape is accepted and treated as flat) and contiguous; dtypes float32, float64, bfloat16,
// float16 (integers work where the backend has them). At W = 1 each operation is an identity that copies only when
// out and in are different memory. See docs/notes/collectives.md for what each backend moves on the wire.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace shardtrain::dist {

enum class ReduceOp { SUM, MEAN, MAX };

enum class CommBackend {
  SELF,  // size 1: nothing to communicate
  GLOO,  // CPU tensors
  NCCL,  // CUDA tensors
  NONE,  // a group's shape alone, no transport (Communicator::shape_only): every operation throws
};

const char* comm_backend_name(CommBackend backend);
const char* reduce_op_name(ReduceOp op);
// Ranks as a message names them: "rank 3", "ranks 0, 2, 3".
std::string ranks_text(const std::vector<int>& ranks);

// An operation in flight. Holds its tensors alive until it completes. wait() blocks until the result is in place,
// runs any local finishing step (the sum of a fallback reduce-scatter, the divide of a mean), and rethrows a
// backend failure or timeout naming the operation and group. A default-constructed Work is complete. Not
// thread-safe: wait on one thread.
class Work {
 public:
  struct State;  // defined in lib/core/src/distributed/work_state.h
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait();
  bool is_completed() const;

 private:
  std::shared_ptr<State> state_;
};

// Waits for every Work in order.
void wait_all(std::vector<Work>& works);

// What Communicator::reduce_scatter holds besides its input and output, in bytes, for `out_elements` elements of
// `element_bytes` each per rank over a group of `ranks` on `backend`: on Gloo two receive buffers of one chunk
// each (one with a single peer) and, for 2-byte types, the float32 accumulator of one chunk and the float32 copy
// of the slice being added into it; nothing on NCCL (its own kernel) or in a group of one. The memory model
// (plan/) counts this, so that it follows the implementation.
int64_t reduce_scatter_scratch_bytes(CommBackend backend, int64_t out_elements, int64_t ranks, int64_t element_bytes);

// A group of ranks that communicate. Cheap to copy (shared handle). Created by ProcessGroup (process_group.h).
class Communicator {
 public:
  struct Impl;  // defined in lib/core/src/distributed/communicator_impl.h
  explicit Communicator(std::shared_ptr<Impl> impl);
  // A group of this rank alone (every operation an identity); `global_rank` is the rank's world rank.
  static Communicator single(int global_rank);
  // The shape of a group — rank `rank` of `size` — without a transport, for what needs only that: the memory model
  // splits a model built on the meta device by a tensor-parallel plan as rank `rank` would. Every operation throws
  // std::logic_error naming it.
  static Communicator shape_only(int rank, int size);

  int rank() const;                               // rank inside this group
  int size() const;                               // W
  const std::vector<int>& global_ranks() const;  // member i is world rank global_ranks()[i]
  CommBackend backend() const;
  const std::string& name() const;  // "world", "shard[0]", ...
  // Where this group's collectives take their tensors: the CUDA device of an NCCL group, else the CPU.
  at::Device device() const;

  Work all_gather(const at::Tensor& out, const at::Tensor& in) const;
  Work reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) const;
  Work all_reduce(const at::Tensor& tensor, ReduceOp op) const;
  Work broadcast(const at::Tensor& tensor, int root) const;
  Work all_to_all(const at::Tensor& out, const at::Tensor& in) const;
  Work barrier() const;
  // Point to point: `tensor` to group rank `peer`, or into `tensor` from it (its shape and dtype agreed beforehand),
  // a send and the receive of the same `tag` pairing up whatever else either rank has in flight. Tags are the
  // caller's numbering, 0 .. kMaxPeerTag (a pipeline's: stage, microbatch and direction), apart from those the
  // collectives use among themselves.
  static constexpr int kMaxPeerTag = (1 << 29) - 1;
  Work send(const at::Tensor& tensor, int peer, int tag) const;
  Work recv(const at::Tensor& tensor, int peer, int tag) const;

  // The backend's own flat reduce-scatter (SUM) and all-gather, unchanged: on Gloo the first is W all-reduces,
  // the second gathers through a scratch buffer as large as the output. Only for the benchmark that shows what
  // reduce_scatter() and all_gather() change; all-reduce above is already the backend's own.
  Work native_reduce_scatter(const at::Tensor& out, const at::Tensor& in) const;
  Work native_all_gather(const at::Tensor& out, const at::Tensor& in) const;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace shardtrain::dist
