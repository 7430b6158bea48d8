#include "shardtrain/distributed/communicator.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "distributed/communicator_impl.h"
#include "distributed/error_text.h"
#include "distributed/work_state.h"

namespace shardtrain::dist {

const char* comm_backend_name(CommBackend backend) {
  switch (backend) {
    case CommBackend::SELF: return "self";
    case CommBackend::GLOO: return "gloo";
    case CommBackend::NCCL: return "nccl";
    case CommBackend::NONE: return "none";
  }
  return "?";
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return out;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::MEAN: return "MEAN";
    case ReduceOp::MAX: return "MAX";
  }
  return "?";
}

// Elements of a half-type chunk summed into the float32 accumulator at a time (4 MiB of float32 temporary).
constexpr int64_t kHalfSlice = int64_t{1} << 20;
// Gloo's reduce-scatter receives the peers' chunks into this many buffers, taken in turn (Incoming).
constexpr int64_t kReceiveBuffers = 2;

int64_t reduce_scatter_scratch_bytes(CommBackend backend, int64_t out_elements, int64_t ranks, int64_t element_bytes) {
  if (backend != CommBackend::GLOO || ranks < 2) return 0;
  const int64_t received = std::min(kReceiveBuffers, ranks - 1) * out_elements * element_bytes;
  const int64_t accumulator = element_bytes == 2 ? (out_elements + std::min(out_elements, kHalfSlice)) * 4 : 0;
  return received + accumulator;
}

namespace {

// Waits (a bounded time, yielding) until `work` is referenced by its caller's handle alone: a Gloo worker thread
// releases the operation it ran right after marking it complete. Bounded so that a backend keeping references
// longer costs 20 ms, not a hang.
void settle(const c10::intrusive_ptr<c10d::Work>& work) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (work.use_count() > 1 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
}

}  // namespace

void Work::wait() {
  if (!state_ || state_->done) return;
  const bool blocks = !state_->works.empty() || state_->finish_transfers;
  {
    // Published while blocked, for the heartbeat's report of a hang.
    struct Posted {
      WaitBoard* board;
      Posted(WaitBoard* b, const std::string& what) : board(b) {
        if (!board) return;
        std::lock_guard<std::mutex> lock(board->mutex);
        board->waiting = what;
      }
      ~Posted() {
        if (!board) return;
        std::lock_guard<std::mutex> lock(board->mutex);
        board->waiting.clear();
      }
    } posted(blocks ? state_->waits.get() : nullptr, state_->what);
    try {
      for (const auto& work : state_->works) work->wait();
      if (state_->finish) state_->finish();
    } catch (const std::exception& e) {
      state_->done = true;  // a failed operation is not retried by a second wait()
      if (!blocks) throw;
      throw std::runtime_error(state_->what + " failed: " + error_text(e));
    }
  }
  // The backend's handle holds the operation's input, output and scratch tensors too: release them with ours.
  if (state_->settle_backend_references) {
    for (const auto& work : state_->works) settle(work);
  }
  state_->works.clear();
  state_->finish = nullptr;
  state_->keep_alive.clear();
  state_->done = true;
}

bool Work::is_completed() const {
  if (!state_ || state_->done) return true;
  if (state_->finish_transfers) return false;
  return std::all_of(state_->works.begin(), state_->works.end(),
                     [](const c10::intrusive_ptr<c10d::Work>& work) { return work->isCompleted(); });
}

void wait_all(std::vector<Work>& works) {
  for (auto& w : works) w.wait();
}

namespace {

using Impl = Communicator::Impl;

std::string describe(const Impl& g, const std::string& op) {
  return op + " on " + g.name + " (rank " + std::to_string(g.rank) + " of " + std::to_string(g.global_ranks.size()) +
         ", " + comm_backend_name(g.kind) + ")";
}

Work make_work(const Impl& g, const std::string& op, std::vector<c10::intrusive_ptr<c10d::Work>> works,
               std::vector<at::Tensor> keep_alive, std::function<void()> finish = {}, bool finish_transfers = false) {
  auto state = std::make_shared<Work::State>();
  state->works = std::move(works);
  state->keep_alive = std::move(keep_alive);
  state->finish = std::move(finish);
  state->finish_transfers = finish_transfers;
  state->what = describe(g, op);
  state->settle_backend_references = g.kind == CommBackend::GLOO;
  state->waits = g.waits;
  return Work(std::move(state));
}

Work make_work(const Impl& g, const std::string& op, c10::intrusive_ptr<c10d::Work> work,
               std::vector<at::Tensor> keep_alive, std::function<void()> finish = {}) {
  return make_work(g, op, std::vector<c10::intrusive_ptr<c10d::Work>>{std::move(work)}, std::move(keep_alive),
                   std::move(finish));
}

void check_transport(const Impl& g, const std::string& op) {
  if (g.kind == CommBackend::NONE) {
    throw std::logic_error(describe(g, op) + ": a group of shape alone (Communicator::shape_only) moves nothing");
  }
}

void check_tensor(const Impl& g, const std::string& op, const char* role, const at::Tensor& t) {
  check_transport(g, op);
  if (!t.defined()) throw std::invalid_argument(describe(g, op) + ": " + role + " tensor is undefined");
  if (!t.is_contiguous()) {
    throw std::invalid_argument(describe(g, op) + ": " + role + " tensor must be contiguous (sizes " +
                                c10::str(t.sizes()) + ", strides " + c10::str(t.strides()) + ")");
  }
  const bool cuda = t.is_cuda();
  if (g.kind == CommBackend::NCCL && !cuda) {
    throw std::invalid_argument(describe(g, op) + ": " + role + " tensor is on " + c10::str(t.device()) +
                                ", the NCCL backend needs CUDA tensors");
  }
  if (g.kind == CommBackend::GLOO && !t.is_cpu() && !(cuda && g.device_index >= 0)) {
    throw std::invalid_argument(describe(g, op) + ": " + role + " tensor is on " + c10::str(t.device()) +
                                ", this Gloo group takes CPU tensors (CUDA ones only in a group made for CUDA)");
  }
}

// [Note: Gloo over CUDA tensors] A Gloo group made for CUDA (CudaBackend::GLOO: ranks sharing one GPU) moves
// CUDA tensors through host copies, as ProcessGroupGloo's own CUDA paths do: the values are copied to the host
// when the operation starts (a blocking copy: it waits for the current stream's producers), Gloo runs on the
// host tensors, and wait() copies the result back on the stream current then. The host copies are the wire
// tensors below; on CPU tensors and on NCCL they are the tensors themselves.
bool staged(const Impl& g, const at::Tensor& t) { return g.kind == CommBackend::GLOO && t.is_cuda(); }
at::Tensor wire_values(const Impl& g, const at::Tensor& t) { return staged(g, t) ? t.to(at::kCPU) : t; }
at::Tensor wire_buffer(const Impl& g, const at::Tensor& t) {
  return staged(g, t) ? at::empty(t.sizes(), t.options().device(at::kCPU)) : t;
}
// `then` and, where `wire` is a host copy of `t`, the copy back into `t` after it.
std::function<void()> copy_back(const at::Tensor& t, const at::Tensor& wire, std::function<void()> then = {}) {
  if (wire.data_ptr() == t.data_ptr()) return then;
  return [t, wire, then]() {
    if (then) then();
    t.copy_(wire);
  };
}

// out must hold W chunks of in's size: all-gather's output, reduce-scatter's input.
void check_flat_pair(const Impl& g, const std::string& op, const at::Tensor& big, const at::Tensor& small,
                     const char* big_role, const char* small_role) {
  check_tensor(g, op, big_role, big);
  check_tensor(g, op, small_role, small);
  if (big.scalar_type() != small.scalar_type()) {
    throw std::invalid_argument(describe(g, op) + ": " + big_role + " dtype " + c10::toString(big.scalar_type()) +
                                " differs from " + small_role + " dtype " + c10::toString(small.scalar_type()));
  }
  const int64_t w = static_cast<int64_t>(g.global_ranks.size());
  if (big.numel() != w * small.numel()) {
    throw std::invalid_argument(describe(g, op) + ": " + big_role + " has " + std::to_string(big.numel()) +
                                " elements, expected " + std::to_string(w) + " x " + std::to_string(small.numel()) +
                                " (" + small_role + ")");
  }
}

bool same_memory(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.nbytes() == b.nbytes();
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::MEAN: return c10d::ReduceOp(c10d::ReduceOp::AVG);
    case ReduceOp::MAX: return c10d::ReduceOp(c10d::ReduceOp::MAX);
  }
  throw std::invalid_argument("unknown ReduceOp");
}


// The chunks a Gloo reduce-scatter receives, one from each peer in rank order, into two buffers of one chunk
// each, taken in turn: a peer's receive is posted once the buffer it lands in has been summed (the first two at
// once, so that they arrive while the caller computes).
class Incoming {
 public:
  Incoming(const Impl& g, int tag, std::vector<int> peers, int64_t n, const at::TensorOptions& options)
      : backend_(g.backend), tag_(tag), peers_(std::move(peers)) {
    const int64_t slots = std::min<int64_t>(kReceiveBuffers, static_cast<int64_t>(peers_.size()));
    buffers_ = at::empty({slots, n}, options);
    for (int64_t i = 0; i < slots; ++i) post(static_cast<size_t>(i));
  }

  // The next peer's chunk, once it has arrived; valid until done_with(). (Each receive is waited for here alone:
  // a Gloo receive's wait() takes its completion, and a second one would wait for another.)
  at::Tensor next() {
    receives_.at(taken_)->wait();
    return buffers_[static_cast<int64_t>(taken_) % kReceiveBuffers];
  }

  // The chunk from next() has been summed: its buffer takes the receive kReceiveBuffers peers on.
  void done_with() {
    const size_t ahead = static_cast<size_t>(kReceiveBuffers);
    if (taken_ + ahead < peers_.size()) post(taken_ + ahead);
    ++taken_;
  }

 private:
  void post(size_t i) {
    std::vector<at::Tensor> into{buffers_[static_cast<int64_t>(i) % kReceiveBuffers]};
    receives_.push_back(backend_->recv(into, peers_[i], tag_));
  }

  c10::intrusive_ptr<c10d::Backend> backend_;
  int tag_;
  std::vector<int> peers_;
  at::Tensor buffers_;  // (kReceiveBuffers, n), or (1, n) with one peer
  std::vector<c10::intrusive_ptr<c10d::Work>> receives_;  // posted so far, in peer order
  size_t taken_ = 0;
};

}  // namespace

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator Communicator::single(int global_rank) {
  auto impl = std::make_shared<Impl>();
  impl->global_ranks = {global_rank};
  impl->name = "single[" + std::to_string(global_rank) + "]";
  return Communicator(std::move(impl));
}

Communicator Communicator::shape_only(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("Communicator::shape_only: rank " + std::to_string(rank) + " of " +
                                std::to_string(size));
  }
  auto impl = std::make_shared<Impl>();
  impl->kind = CommBackend::NONE;
  impl->rank = rank;
  impl->global_ranks.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) impl->global_ranks[static_cast<size_t>(r)] = r;
  impl->name = "shape[" + std::to_string(rank) + " of " + std::to_string(size) + "]";
  return Communicator(std::move(impl));
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return static_cast<int>(impl_->global_ranks.size()); }
const std::vector<int>& Communicator::global_ranks() const { return impl_->global_ranks; }
CommBackend Communicator::backend() const { return impl_->kind; }
at::Device Communicator::device() const {
  return impl_->device_index >= 0 ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(impl_->device_index))
                                  : at::Device(at::kCPU);
}
const std::string& Communicator::name() const { return impl_->name; }

Work Communicator::all_gather(const at::Tensor& out, const at::Tensor& in) const {
  const Impl& g = *impl_;
  check_flat_pair(g, "all_gather", out, in, "output", "input");
  if (g.kind == CommBackend::SELF) {
    if (!same_memory(out, in)) out.view(-1).copy_(in.view(-1));
    return Work();
  }
  // Each rank receives the W-1 other chunks: (W-1)/W of the output, what a ring moves.
  at::Tensor flat_out = wire_buffer(g, out.view(-1));
  at::Tensor flat_in = wire_values(g, in.view(-1));
  if (g.kind == CommBackend::NCCL) {
    return make_work(g, "all_gather", g.backend->_allgather_base(flat_out, flat_in), {out, in, flat_out, flat_in},
                     copy_back(out.view(-1), flat_out));
  }
  // Gloo's all-gather gathers into a scratch buffer as large as the output and copies it out at the end: one
  // more full-size buffer (a whole layer, for FSDP) alive while each gather runs, beside the layer computing. A
  // broadcast from each rank of its chunk, in place in the output, moves the same bytes without it.
  const int64_t n = flat_in.numel();
  at::Tensor own = flat_out.narrow(0, g.rank * n, n);
  if (!same_memory(own, flat_in)) own.copy_(flat_in);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int root = 0; root < size(); ++root) {
    std::vector<at::Tensor> chunk{flat_out.narrow(0, root * n, n)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    works.push_back(g.backend->broadcast(chunk, opts));
  }
  return make_work(g, "all_gather", std::move(works), {out, in, flat_out, flat_in},
                   copy_back(out.view(-1), flat_out));
}

Work Communicator::reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) const {
  const Impl& g = *impl_;
  const std::string what = std::string("reduce_scatter(") + reduce_op_name(op) + ")";
  check_flat_pair(g, what, in, out, "input", "output");
  const int64_t w = size();
  if (g.kind == CommBackend::SELF) {
    if (!same_memory(out, in)) out.view(-1).copy_(in.view(-1));  // SUM, MEAN and MAX of one value are the value
    return Work();
  }
  if (g.kind == CommBackend::NCCL) {
    at::Tensor flat_out = out.view(-1);
    at::Tensor flat_in = in.view(-1);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    return make_work(g, what, g.backend->_reduce_scatter_base(flat_out, flat_in, opts), {out, in});
  }
  // Gloo: its reduce-scatter all-reduces every chunk, moving 2(W-1)/W of the input per rank. Ours sends chunk j
  // of the input to rank j (what a ring reduce-scatter moves, (W-1)/W) and sums what arrives into the output
  // in rank order, the same order as a sum over a (W, n) view: half types in a float32 accumulator, rounded once.
  // The chunks arrive into two buffers of one chunk each, taken in turn (an all-to-all would need a receive
  // buffer as large as the input, a whole unit's gradients under FSDP). See docs/notes/collectives.md.
  at::Tensor flat_out = wire_buffer(g, out.view(-1));
  at::Tensor flat_in = wire_values(g, in.view(-1));
  const int64_t n = flat_out.numel();
  if (n == 0) return Work();  // every rank's chunk is empty: nothing to move
  const int tag = impl_->next_tag();
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  std::vector<int> peers;  // the ranks whose chunks this rank receives, in rank order
  for (int peer = 0; peer < w; ++peer) {
    if (peer == g.rank) continue;
    peers.push_back(peer);
    std::vector<at::Tensor> chunk{flat_in.narrow(0, peer * n, n)};
    sends.push_back(g.backend->send(chunk, peer, tag));
  }
  auto incoming = std::make_shared<Incoming>(g, tag, std::move(peers), n, flat_in.options());
  const int64_t own = g.rank;
  auto reduce = [incoming, sends, flat_in, flat_out, op, w, n, own]() {
    const bool exact = flat_out.scalar_type() == at::kFloat || flat_out.scalar_type() == at::kDouble;
    at::Tensor acc = exact ? flat_out : at::empty({n}, flat_out.options().dtype(at::kFloat));
    // Half types in slices: adding one into the float32 accumulator converts it to a float32 temporary first.
    const int64_t slice = exact ? n : kHalfSlice;
    for (int64_t src = 0; src < w; ++src) {
      at::Tensor chunk = src == own ? flat_in.narrow(0, own * n, n) : incoming->next();
      for (int64_t start = 0; start < n; start += slice) {
        at::Tensor a = acc.narrow(0, start, std::min(slice, n - start)), c = chunk.narrow(0, start, a.numel());
        if (src == 0) {
          a.copy_(c);
        } else if (op == ReduceOp::MAX) {
          at::maximum_out(a, a, c);
        } else {
          a.add_(c);
        }
      }
      if (src != own) incoming->done_with();
    }
    if (op == ReduceOp::MEAN) acc.div_(w);
    if (!exact) flat_out.copy_(acc);
    // A peer takes this rank's chunk in its own wait(), which needs nothing from this rank but the sends posted
    // when the operation started: no waiting in a cycle.
    for (const auto& send : sends) send->wait();
  };
  return make_work(g, what, {}, {out, in, flat_out, flat_in},
                   copy_back(out.view(-1), flat_out, std::move(reduce)), /*finish_transfers=*/true);
}

Work Communicator::native_reduce_scatter(const at::Tensor& out, const at::Tensor& in) const {
  const Impl& g = *impl_;
  check_flat_pair(g, "native_reduce_scatter", in, out, "input", "output");
  if (g.kind == CommBackend::SELF) return reduce_scatter(out, in, ReduceOp::SUM);
  at::Tensor flat_out = wire_buffer(g, out.view(-1));
  at::Tensor flat_in = wire_values(g, in.view(-1));
  return make_work(g, "native_reduce_scatter", g.backend->_reduce_scatter_base(flat_out, flat_in),
                   {out, in, flat_out, flat_in}, copy_back(out.view(-1), flat_out));
}

Work Communicator::native_all_gather(const at::Tensor& out, const at::Tensor& in) const {
  const Impl& g = *impl_;
  check_flat_pair(g, "native_all_gather", out, in, "output", "input");
  if (g.kind == CommBackend::SELF) return all_gather(out, in);
  at::Tensor flat_out = wire_buffer(g, out.view(-1));
  at::Tensor flat_in = wire_values(g, in.view(-1));
  return make_work(g, "native_all_gather", g.backend->_allgather_base(flat_out, flat_in),
                   {out, in, flat_out, flat_in}, copy_back(out.view(-1), flat_out));
}

Work Communicator::all_reduce(const at::Tensor& tensor, ReduceOp op) const {
  const Impl& g = *impl_;
  const std::string what = std::string("all_reduce(") + reduce_op_name(op) + ")";
  check_tensor(g, what, "input", tensor);
  if (g.kind == CommBackend::SELF) return Work();
  at::Tensor wire = wire_values(g, tensor.view(-1));
  std::vector<at::Tensor> tensors{wire};
  c10d::AllreduceOptions opts;
  std::function<void()> finish;
  if (op == ReduceOp::MEAN && g.kind == CommBackend::GLOO) {
    // Gloo has no average of its own in every version: sum, then divide once the sum is in place.
    opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
    const double w = size();
    finish = [wire, w]() { wire.div_(w); };
  } else {
    opts.reduceOp = to_c10d(op);
  }
  return make_work(g, what, g.backend->allreduce(tensors, opts), {tensor, wire},
                   copy_back(tensor.view(-1), wire, std::move(finish)));
}

Work Communicator::broadcast(const at::Tensor& tensor, int root) const {
  const Impl& g = *impl_;
  const std::string what = "broadcast(root " + std::to_string(root) + ")";
  check_tensor(g, what, "input", tensor);
  if (root < 0 || root >= size()) {
    throw std::invalid_argument(describe(g, what) + ": root " + std::to_string(root) + " is not a rank of this group");
  }
  if (g.kind == CommBackend::SELF) return Work();
  at::Tensor wire = wire_values(g, tensor.view(-1));
  std::vector<at::Tensor> tensors{wire};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return make_work(g, what, g.backend->broadcast(tensors, opts), {tensor, wire}, copy_back(tensor.view(-1), wire));
}

Work Communicator::all_to_all(const at::Tensor& out, const at::Tensor& in) const {
  const Impl& g = *impl_;
  check_tensor(g, "all_to_all", "output", out);
  check_tensor(g, "all_to_all", "input", in);
  if (out.numel() != in.numel() || out.scalar_type() != in.scalar_type() || in.numel() % size() != 0) {
    throw std::invalid_argument(describe(g, "all_to_all") + ": input (" + std::to_string(in.numel()) + " x " +
                                c10::toString(in.scalar_type()) + ") and output (" + std::to_string(out.numel()) +
                                " x " + c10::toString(out.scalar_type()) +
                                ") must have the same dtype and a size divisible by the group size " +
                                std::to_string(size()));
  }
  if (g.kind == CommBackend::SELF) {
    if (!same_memory(out, in)) out.view(-1).copy_(in.view(-1));
    return Work();
  }
  at::Tensor flat_out = wire_buffer(g, out.view(-1));
  at::Tensor flat_in = wire_values(g, in.view(-1));
  std::vector<int64_t> equal_splits;
  return make_work(g, "all_to_all", g.backend->alltoall_base(flat_out, flat_in, equal_splits, equal_splits),
                   {out, in, flat_out, flat_in}, copy_back(out.view(-1), flat_out));
}

Work Communicator::barrier() const {
  const Impl& g = *impl_;
  check_transport(g, "barrier");
  if (g.kind == CommBackend::SELF) return Work();
  c10d::BarrierOptions opts;
  if (g.kind == CommBackend::NCCL) opts.device_ids = {static_cast<int64_t>(g.device_index)};
  return make_work(g, "barrier", g.backend->barrier(opts), {});
}

namespace {

// A point-to-point operation's peer and tag, checked; the tag as it goes on the wire: above every tag the
// collectives take from Impl::next_tag (those stay below 2^30).
int peer_tag(const Impl& g, const std::string& what, int peer, int tag) {
  if (peer < 0 || peer >= static_cast<int>(g.global_ranks.size()) || peer == g.rank) {
    throw std::invalid_argument(describe(g, what) + ": peer " + std::to_string(peer) +
                                " is not another rank of this group");
  }
  if (tag < 0 || tag > Communicator::kMaxPeerTag) {
    throw std::invalid_argument(describe(g, what) + ": tag " + std::to_string(tag) + " is not in 0.." +
                                std::to_string(Communicator::kMaxPeerTag));
  }
  return (1 << 30) | tag;
}

}  // namespace

Work Communicator::send(const at::Tensor& tensor, int peer, int tag) const {
  const Impl& g = *impl_;
  const std::string what = "send(to " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
  check_tensor(g, what, "input", tensor);
  const int wire_tag = peer_tag(g, what, peer, tag);
  at::Tensor wire = wire_values(g, tensor.view(-1));
  std::vector<at::Tensor> tensors{wire};
  return make_work(g, what, g.backend->send(tensors, peer, wire_tag), {tensor, wire});
}

Work Communicator::recv(const at::Tensor& tensor, int peer, int tag) const {
  const Impl& g = *impl_;
  const std::string what = "recv(from " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
  check_tensor(g, what, "output", tensor);
  const int wire_tag = peer_tag(g, what, peer, tag);
  at::Tensor wire = wire_buffer(g, tensor.view(-1));
  std::vector<at::Tensor> tensors{wire};
  return make_work(g, what, g.backend->recv(tensors, peer, wire_tag), {tensor, wire},
                   copy_back(tensor.view(-1), wire));
}

}  // namespace shardtrain::dist
