#include "shardtrain/optim/disk_adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "optim/closure.h"
#include "shardtrain/io/scratch_file.h"

namespace shardtrain::optim {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t padded(int64_t bytes) {
  const int64_t k = io::ScratchFile::kAlignment;
  return (bytes + k - 1) / k * k;
}

// Where a parameter's moments are in the file: exp_avg at offset, exp_avg_sq one moment later.
struct Slot {
  int64_t offset = 0;
  int64_t moment_bytes = 0;  // one moment, padded
};

// A parameter stepping this step, with its state and group's options.
struct Entry {
  at::Tensor param;
  DiskAdamWParamState* state = nullptr;
  Slot slot;
  const torch::optim::AdamWOptions* options = nullptr;
  bool fresh = false;  // no state before this step: its moments are zeros whatever the file holds
};

// A run of entries with consecutive slots: one read, one write.
struct Chunk {
  size_t first = 0, last = 0;  // entries [first, last)
  int64_t offset = 0, bytes = 0;
};

at::Tensor moment_view(char* base, const at::Tensor& param) {
  return at::from_blob(base, param.sizes(), param.options().device(at::kCPU));
}

}  // namespace

struct DiskAdamW::Store {
  io::ScratchFile file;
  std::unordered_map<const c10::TensorImpl*, Slot> slots;
  int64_t chunk_bytes = 0;
  io::AlignedBuffer buffers[2];
};

DiskAdamW::DiskAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
                     DiskStateOptions disk)
    : torch::optim::AdamW(std::move(groups), defaults) {
  std::unordered_map<const c10::TensorImpl*, Slot> slots;
  int64_t end = 0;
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) {
      throw std::invalid_argument("the disk tier's AdamW has no AMSGrad (optim.amsgrad with parallel.offload: nvme)");
    }
    for (const auto& p : group.params()) {
      if (slots.count(p.unsafeGetTensorImpl()) != 0) continue;
      Slot s{end, padded(p.numel() * static_cast<int64_t>(p.element_size()))};
      slots.emplace(p.unsafeGetTensorImpl(), s);
      end += 2 * s.moment_bytes;
    }
  }
  store_ = std::make_unique<Store>(Store{io::ScratchFile::create(disk.dir, disk.name, std::max<int64_t>(end, 4096)),
                                         std::move(slots), disk.chunk_bytes, {}});
}

DiskAdamW::~DiskAdamW() = default;

int64_t DiskAdamW::disk_bytes() const { return store_->file.size(); }
bool DiskAdamW::direct() const { return store_->file.direct(); }

std::map<std::string, at::Tensor> DiskAdamW::empty_state(const at::Tensor& param, int64_t step) {
  if (store_->slots.count(param.unsafeGetTensorImpl()) == 0) {
    throw std::invalid_argument("DiskAdamW: a parameter of shape " + c10::str(param.sizes()) + " it does not hold");
  }
  auto s = std::make_unique<DiskAdamWParamState>();
  s->owner = this;
  s->step(step);
  s->exp_avg(at::zeros_like(param, at::MemoryFormat::Contiguous));
  s->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Contiguous));
  std::map<std::string, at::Tensor> moments{{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}};
  state_[param.unsafeGetTensorImpl()] = std::move(s);
  return moments;
}

std::map<std::string, at::Tensor> DiskAdamW::read_state(const at::Tensor& param) {
  auto slot = store_->slots.find(param.unsafeGetTensorImpl());
  auto state = state_.find(param.unsafeGetTensorImpl());
  if (slot == store_->slots.end() || state == state_.end()) {
    throw std::invalid_argument("DiskAdamW: no state for a parameter of shape " + c10::str(param.sizes()));
  }
  const auto& s = static_cast<const DiskAdamWParamState&>(*state->second);
  if (s.exp_avg().defined()) return {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};  // to be filled
  io::AlignedBuffer bytes(2 * slot->second.moment_bytes);
  store_->file.wait(store_->file.read(bytes.data(), bytes.size(), slot->second.offset));
  return {{"exp_avg", moment_view(bytes.data(), param).clone()},
          {"exp_avg_sq", moment_view(bytes.data() + slot->second.moment_bytes, param).clone()}};
}

at::Tensor DiskAdamW::step(LossClosure closure) {
  const at::Tensor loss = evaluate_closure(closure);
  const auto started = Clock::now();
  c10::AutoGradMode no_grad(false);
  Store& st = *store_;
  last_ = DiskStepStats{};

  std::vector<Entry> entries;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& g = p.grad();
      if (!p.is_cpu() || !p.is_contiguous() || !at::isFloatingType(p.scalar_type()) || !g.is_cpu() ||
          !g.is_contiguous() || g.sizes() != p.sizes() || g.scalar_type() != p.scalar_type() || g.is_sparse()) {
        throw std::invalid_argument("DiskAdamW: a parameter of shape " + c10::str(p.sizes()) + " on " +
                                    p.device().str() + " (the disk tier steps contiguous floating parameters and "
                                    "gradients alike on the host: offload the parameters too)");
      }
      auto it = state_.find(p.unsafeGetTensorImpl());
      const bool fresh = it == state_.end();
      if (fresh) {
        auto s = std::make_unique<DiskAdamWParamState>();
        s->owner = this;
        s->step(0);
        it = state_.emplace(p.unsafeGetTensorImpl(), std::move(s)).first;
      }
      entries.push_back({p, static_cast<DiskAdamWParamState*>(it->second.get()),
                         st.slots.at(p.unsafeGetTensorImpl()), &o, fresh});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.slot.offset < b.slot.offset; });
  std::vector<Chunk> chunks;
  int64_t largest = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Slot& s = entries[i].slot;
    const bool joins = !chunks.empty() && chunks.back().offset + chunks.back().bytes == s.offset &&
                       chunks.back().bytes + 2 * s.moment_bytes <= st.chunk_bytes;
    if (!joins) chunks.push_back({i, i, s.offset, 0});
    chunks.back().last = i + 1;
    chunks.back().bytes += 2 * s.moment_bytes;
    largest = std::max(largest, chunks.back().bytes);
  }
  // In the caller's tier (the host's, offloaded); the second only where there is a second chunk.
  for (size_t i = 0; i < std::min<size_t>(2, chunks.size()); ++i) {
    if (st.buffers[i].size() < largest) st.buffers[i] = io::AlignedBuffer(largest);
  }

  // Chunk k in buffer k % 2: read k + 1 while k steps, once k - 1's write from that buffer is done.
  std::vector<uint64_t> reads(chunks.size()), writes(chunks.size());
  auto wait = [&](uint64_t ticket) {
    const auto t = Clock::now();
    st.file.wait(ticket);
    last_.io_wait_s += since(t);
  };
  if (!chunks.empty()) reads[0] = st.file.read(st.buffers[0].data(), chunks[0].bytes, chunks[0].offset);
  for (size_t k = 0; k < chunks.size(); ++k) {
    const Chunk& c = chunks[k];
    char* buffer = st.buffers[k % 2].data();
    wait(reads[k]);
    if (k + 1 < chunks.size()) {
      if (k >= 1) wait(writes[k - 1]);
      reads[k + 1] = st.file.read(st.buffers[(k + 1) % 2].data(), chunks[k + 1].bytes, chunks[k + 1].offset);
    }
    const auto computing = Clock::now();
    // Per group's options (and dtype): the same fused call FusedAdamW makes.
    std::map<std::pair<const torch::optim::AdamWOptions*, at::ScalarType>,
             std::array<std::vector<at::Tensor>, 5>> calls;  // params, grads, exp_avgs, exp_avg_sqs, steps
    for (size_t i = c.first; i < c.last; ++i) {
      Entry& e = entries[i];
      char* at = buffer + (e.slot.offset - c.offset);
      at::Tensor exp_avg = moment_view(at, e.param), exp_avg_sq = moment_view(at + e.slot.moment_bytes, e.param);
      if (e.fresh) {
        exp_avg.zero_(), exp_avg_sq.zero_();
      } else if (e.state->exp_avg().defined()) {  // a loaded state, to disk now
        exp_avg.copy_(e.state->exp_avg()), exp_avg_sq.copy_(e.state->exp_avg_sq());
        e.state->exp_avg(at::Tensor()), e.state->exp_avg_sq(at::Tensor());
      }
      e.state->step(e.state->step() + 1);
      auto& call = calls[{e.options, e.param.scalar_type()}];
      call[0].push_back(e.param), call[1].push_back(e.param.grad()), call[2].push_back(exp_avg);
      call[3].push_back(exp_avg_sq);
      call[4].push_back(at::full({}, static_cast<double>(e.state->step()), e.param.options().dtype(at::kFloat)));
    }
    for (auto& [key, t] : calls) {
      const torch::optim::AdamWOptions& o = *key.first;
      at::_fused_adamw_(t[0], t[1], t[2], t[3], /*max_exp_avg_sqs=*/{}, t[4], o.lr(), std::get<0>(o.betas()),
                        std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
    }
    last_.compute_s += since(computing);
    writes[k] = st.file.write(buffer, c.bytes, c.offset);
    last_.bytes_read += c.bytes, last_.bytes_written += c.bytes;
  }
  const auto t = Clock::now();
  st.file.wait_all();
  last_.io_wait_s += since(t);
  last_.chunks = static_cast<int64_t>(chunks.size());
  last_.seconds = since(started);
  return loss;
}

}  // namespace shardtrain::optim
