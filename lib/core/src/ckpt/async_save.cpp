#include "shardtrain/ckpt/async_save.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <vector>

#include "ckpt/checkpoint_parts.h"
#include "ckpt/copy_checked.h"
#include "ckpt/save_plan.h"
#include "shardtrain/memory/memory_stats.h"

namespace shardtrain::ckpt {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// The staging buffer: one host block per storage a save writes (a unit's flat shard, an optimizer moment), kept for
// the next save, which reuses the blocks of the sizes it needs (the optimizer's state of a parameter no step has
// reached yet comes later) and frees the others. A tensor's copy is a view of its storage's block at the same
// offset, sizes and strides, so tensors that shared a storage still do and io::save_pickle writes the same bytes.
struct AsyncCheckpointer::Staging {
  std::vector<at::Tensor> blocks;  // uint8 [bytes] each: the last save's
  std::multimap<int64_t, at::Tensor> spare;  // bytes -> a block of the save before, while one is staged
  // The save's source storages -> their blocks, until it is handed over.
  std::map<const c10::StorageImpl*, at::Tensor> copied;
  std::vector<c10::Device> devices;  // the GPUs copied from (the copies are waited for there)
  // Whether some storage copied may hold NaN or Inf: an element's exponent was all ones (in the padding of a shard,
  // perhaps), or it was not read (a GPU's: the exact check is fast there; float8). Then the model is checked exactly.
  bool maybe_non_finite = false;

  int64_t bytes() const {
    int64_t n = 0;
    for (const at::Tensor& block : blocks) n += block.numel();
    return n;
  }

  at::Tensor block_for(const at::Tensor& t) {
    const c10::Storage& storage = t.storage();
    auto it = copied.find(storage.unsafeGetStorageImpl());
    if (it != copied.end()) return it->second;
    const int64_t nbytes = static_cast<int64_t>(storage.nbytes());
    at::Tensor block;
    for (auto [it, end] = spare.equal_range(nbytes); it != end; ++it) {
      if (it->second.is_pinned() == t.is_cuda()) {
        block = std::move(it->second);
        spare.erase(it);
        break;
      }
    }
    if (!block.defined()) {
      // Host memory beside the compute tier's (memory/memory_stats.h): on a GPU the block is the host's.
      const memory::CpuTierScope host(memory::CpuTier::HOST);
      block = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(t.is_cuda()));
    }
    blocks.push_back(block);
    if (t.is_cuda()) {
      const at::Tensor source = at::empty({0}, t.options().dtype(at::kByte)).set_(storage, 0, {nbytes}, {1});
      block.copy_(source, /*non_blocking=*/true);  // into pinned memory: waited for at the end of stage()
      maybe_non_finite = maybe_non_finite || t.is_floating_point();
    } else if (nbytes > 0) {
      const Finiteness seen = copy_checked(block.data_ptr(), storage.data(), nbytes, t.scalar_type());
      maybe_non_finite = maybe_non_finite || seen != Finiteness::FINITE;
    }
    if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
    copied.emplace(storage.unsafeGetStorageImpl(), block);
    return block;
  }

  at::Tensor copy_of(const at::Tensor& t) {
    if (!t.defined()) return t;
    const at::Tensor block = block_for(t);
    return at::empty({0}, at::TensorOptions().dtype(t.dtype()))
        .set_(block.storage(), t.storage_offset(), t.sizes(), t.strides());
  }

  c10::IValue copy_of(const c10::IValue& v) {
    if (v.isTensor()) return copy_of(v.toTensor());
    if (v.isGenericDict()) {
      const c10::impl::GenericDict dict = v.toGenericDict();
      c10::impl::GenericDict out(dict.keyType(), dict.valueType());
      for (const auto& item : dict) out.insert(item.key(), copy_of(item.value()));
      return out;
    }
    if (v.isList()) {
      const c10::List<c10::IValue> list = v.toList();
      c10::impl::GenericList out(list.elementType());
      for (const c10::IValue& item : list) out.push_back(copy_of(item));
      return out;
    }
    if (v.isTuple()) {
      std::vector<c10::IValue> items;
      for (const c10::IValue& item : v.toTupleRef().elements()) items.push_back(copy_of(item));
      return c10::ivalue::Tuple::create(std::move(items));
    }
    return v;
  }

  // Every tensor the plan writes replaced by its copy; returns once the copies are done.
  void stage(SavePlan& plan) {
    for (at::Tensor& block : blocks) spare.emplace(block.numel(), std::move(block));
    blocks.clear(), copied.clear(), devices.clear();
    maybe_non_finite = false;
    for (std::vector<PlannedFile>& phase : plan.phases) {
      for (PlannedFile& f : phase) {
        if (auto* pickle = std::get_if<c10::IValue>(&f.contents)) {
          *pickle = copy_of(*pickle);
        } else if (auto* tensors = std::get_if<NamedTensors>(&f.contents)) {
          for (auto& [name, t] : *tensors) t = copy_of(t);
        }
      }
    }
    for (const c10::Device& device : devices) {
      const c10::impl::VirtualGuardImpl impl(device.type());
      impl.getStream(device).synchronize();
    }
    spare.clear();  // the blocks this save did not need
  }

  // Whether the copies read every parameter and optimizer state tensor of `model` this rank holds: not so on a rank
  // that writes none of them (DDP's and a hybrid model's other replicas), whose state is checked another way.
  bool read_all_of(const CheckpointModel& model) const {
    const auto read = [&](const at::Tensor& t) { return copied.count(t.storage().unsafeGetStorageImpl()) > 0; };
    for (const auto& [name, p] : named_parameters(*model.root)) {
      if (!read(p)) return false;
    }
    for (const auto& [key, tensors] : moments(model)) {
      for (const auto& [name, t] : tensors) {
        if (!read(t.tensor)) return false;
      }
    }
    return true;
  }
};

AsyncCheckpointer::AsyncCheckpointer(dist::Communicator writers)
    : writers_(std::move(writers)), staging_(std::make_unique<Staging>()) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (pending_.valid()) pending_.wait();
}

bool AsyncCheckpointer::writing() const {
  return pending_.valid() && pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

int64_t AsyncCheckpointer::staging_bytes() const { return staging_->bytes(); }

AsyncSaveStarted AsyncCheckpointer::save(const std::string& dir, const TrainerState& state,
                                         const CheckpointModel& model, const dist::Communicator& world,
                                         std::function<void(const dist::Communicator& writers)> then) {
  if (pending_.valid()) throw std::logic_error("AsyncCheckpointer::save: a save is in flight; wait() for it first");
  if (writers_.size() != world.size() || writers_.rank() != world.rank()) {
    throw std::invalid_argument("AsyncCheckpointer: the writers' group (rank " + std::to_string(writers_.rank()) +
                                " of " + std::to_string(writers_.size()) + ") is not the world's (rank " +
                                std::to_string(world.rank()) + " of " + std::to_string(world.size()) + ")");
  }
  const auto start = std::chrono::steady_clock::now();
  SavePlan plan = plan_save(dir, state, model, world, /*check_finite=*/false);
  staging_->stage(plan);
  // What save_checkpoint checks first, checked on the copies as they were made; exactly where an element may be
  // NaN or Inf, or where this rank writes none of its state.
  const bool exact = staging_->maybe_non_finite || !staging_->read_all_of(model);
  staging_->copied.clear();  // the sources may go
  refuse_non_finite(plan, exact ? non_finite_state(model) : "", world);
  AsyncSaveStarted started{plan.final_path, staging_->bytes(), seconds_since(start)};
  pending_ = std::async(std::launch::async,
                        [plan = std::move(plan), writers = writers_, then = std::move(then)]() -> AsyncSaveDone {
                          const auto begin = std::chrono::steady_clock::now();
                          // What the writer allocates (hashing, the exchanges) is host memory too.
                          const memory::CpuTierScope host(memory::CpuTier::HOST);
                          AsyncSaveDone done{write_save(plan, writers), plan.step, 0};
                          if (then) then(writers);
                          done.written_seconds = seconds_since(begin);
                          return done;
                        });
  return started;
}

std::optional<AsyncSaveDone> AsyncCheckpointer::wait() {
  if (!pending_.valid()) return std::nullopt;
  return pending_.get();  // valid() is false after, whether it returned or threw
}

}  // namespace shardtrain::ckpt
