#include "shardtrain/ddp/replicate.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <stdexcept>

#include "nn/after_accumulate.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::ddp {
namespace {

// A bucket: consecutive parameters (in reverse registration order) whose gradients travel in one flat buffer.
struct Bucket {
  std::vector<size_t> params;  // indices into Impl::params
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  size_t ready = 0;
  at::Tensor flat;  // (numel) gradients, then their mean once work completes; kept with gradient_as_bucket_view
  dist::Work work;
};

// A tensor of `sizes` over flat[offset, offset + numel) that shares its storage without being an autograd view:
// optimizers' zero_grad() detaches gradients in place, which views do not allow.
at::Tensor alias_into(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return t;
}

}  // namespace

// Bucket all-reduces in flight at once during backward (the memory model's two buckets).
constexpr size_t kBucketsInFlight = 2;

struct Ddp::Impl : std::enable_shared_from_this<Ddp::Impl> {
  dist::Communicator group;
  DdpOptions options;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<size_t> bucket_of;  // parameter index -> bucket index
  std::vector<int64_t> offset_in_bucket;  // parameter index -> its first element in the bucket's flat buffer
  std::vector<char> has_grad;     // this backward
  std::vector<Bucket> buckets;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive: tensors hold them weakly
  size_t next_launch = 0;
  bool sync = true;
  bool callback_queued = false;
  int64_t all_reduces = 0;

  Impl(dist::Communicator g, DdpOptions o) : group(std::move(g)), options(o) {}

  void on_gradient(size_t index) {
    if (!sync) return;  // no_sync: AccumulateGrad keeps accumulating into .grad
    if (!callback_queued) {
      std::weak_ptr<Impl> weak = weak_from_this();
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (auto self = weak.lock()) self->finish_backward();
      });
      callback_queued = true;
    }
    if (has_grad[index]) return;  // a parameter used twice: AccumulateGrad runs once per backward anyway
    has_grad[index] = 1;
    Bucket& b = buckets[bucket_of[index]];
    if (options.gradient_as_bucket_view) view_gradient_in_bucket(b, index);
    if (++b.ready == b.params.size()) launch_ready();
  }

  // Starts every bucket that is complete and whose predecessors have started: one order on every rank. At most
  // kBucketsInFlight are reduced at once: before another starts, the earliest is waited for and its mean written
  // back (without gradient_as_bucket_view, a flat copy of every gradient otherwise lived until the end of
  // backward: a whole model's gradients twice). `used`: as complete()'s.
  void launch_ready(const std::vector<char>* used = nullptr) {
    while (next_launch < buckets.size() && buckets[next_launch].ready == buckets[next_launch].params.size()) {
      if (next_launch >= kBucketsInFlight) complete(buckets[next_launch - kBucketsInFlight], used);
      launch(buckets[next_launch]);
      ++next_launch;
    }
  }

  // Waits for bucket `b`'s all-reduce and writes the mean into the gradients of its parameters that some rank used
  // (`used`; nullptr: all, as during backward, where a bucket is complete when all its parameters had one here;
  // at its end, parameters no rank used keep no gradient).
  void complete(Bucket& b, const std::vector<char>* used) {
    b.work.wait();
    b.work = dist::Work();
    c10::AutoGradMode no_grad(false);
    if (options.gradient_as_bucket_view || !b.flat.defined()) return;  // the gradients are the bucket, or done
    for (size_t k = 0; k < b.params.size(); ++k) {
      if (used && !(*used)[b.params[k]]) continue;
      const at::Tensor& p = params[b.params[k]];
      at::Tensor mean = b.flat.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
      at::Tensor& grad = p.mutable_grad();
      if (grad.defined()) {
        grad.copy_(mean);
      } else {
        grad = mean.clone();  // its own tensor: zero_grad() detaches gradients in place
      }
    }
    b.flat = at::Tensor();
  }

  // gradient_as_bucket_view: points parameter `index`'s .grad at its slot of bucket `b`, copying its value in
  // unless it is already there (an undefined gradient is zero).
  void view_gradient_in_bucket(Bucket& b, size_t index) {
    c10::AutoGradMode no_grad(false);
    const at::Tensor& p = params[index];
    const int64_t offset = offset_in_bucket[index];
    at::Tensor& grad = p.mutable_grad();
    if (grad.defined() && grad.data_ptr() == b.flat.narrow(0, offset, p.numel()).data_ptr()) return;
    at::Tensor slot = alias_into(b.flat, offset, p.sizes());
    if (grad.defined()) {
      slot.copy_(grad);
    } else {
      slot.zero_();
    }
    grad = std::move(slot);
  }

  void launch(Bucket& b) {
    if (group.size() == 1) return;  // its own mean already: no second copy of every gradient, no collective
    c10::AutoGradMode no_grad(false);
    if (!options.gradient_as_bucket_view) {
      b.flat = at::zeros({b.numel}, params[b.params.front()].options().requires_grad(false));
      for (size_t k = 0; k < b.params.size(); ++k) {
        const at::Tensor& g = params[b.params[k]].grad();
        if (g.defined()) b.flat.narrow(0, b.offsets[k], g.numel()).copy_(g.reshape({-1}));
      }
    }
    b.work = group.all_reduce(b.flat, dist::ReduceOp::MEAN);
    ++all_reduces;
  }

  // Which parameters some rank gave a gradient in this backward (an all-reduce of the ranks' has_grad).
  // Filled and read through the host buffer, not element by element: this runs after every backward.
  std::vector<char> used_anywhere() {
    const int64_t n = static_cast<int64_t>(params.size());
    at::Tensor used = at::empty({n}, at::kFloat);
    float* flags = used.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) flags[i] = has_grad[static_cast<size_t>(i)] ? 1.0f : 0.0f;
    at::Tensor wire = used.to(group.device());
    group.all_reduce(wire, dist::ReduceOp::MAX).wait();
    used = wire.cpu().contiguous();
    flags = used.data_ptr<float>();
    return std::vector<char>(flags, flags + n);  // 0 or 1 each
  }

  void finish_backward() {
    callback_queued = false;
    // Parameters that took no part here: an error naming the first, unless find_unused_parameters. Then, as in
    // PyTorch's DDP, one no rank used keeps its gradient as it was (none after zero_grad: optimizers skip it, so
    // neither its moments nor weight decay move it); one another rank used gets the mean, this rank's share zero.
    std::vector<char> used(params.size(), 1);
    if (options.find_unused_parameters) used = used_anywhere();
    for (size_t i = 0; i < params.size(); ++i) {
      if (has_grad[i] || !params[i].requires_grad()) continue;
      if (!options.find_unused_parameters) {
        reset();
        throw std::runtime_error("replicate: parameter '" + names[i] + "' received no gradient in this backward; "
                                 "every parameter must contribute to the loss on every rank, or set "
                                 "DdpOptions::find_unused_parameters");
      }
      has_grad[i] = 1;
      if (options.gradient_as_bucket_view && used[i]) view_gradient_in_bucket(buckets[bucket_of[i]], i);
      ++buckets[bucket_of[i]].ready;
    }
    launch_ready(&used);
    for (Bucket& b : buckets) complete(b, &used);  // those completed already return at once
    reset();
  }

  void reset() {
    for (Bucket& b : buckets) {
      b.ready = 0;
      if (!options.gradient_as_bucket_view) b.flat = at::Tensor();
      b.work = dist::Work();
    }
    std::fill(has_grad.begin(), has_grad.end(), 0);
    next_launch = 0;
  }
};

namespace {

// Placed on an Interceptable module: owns the reducer for the module's lifetime and copies buffers from rank 0
// before each forward.
class ReplicateInterceptor : public nn::Interceptor {
 public:
  ReplicateInterceptor(std::shared_ptr<Ddp::Impl> impl, std::vector<at::Tensor> buffers)
      : impl_(std::move(impl)), buffers_(std::move(buffers)) {}
  nn::TensorVec around(torch::nn::Module&, nn::TensorVec inputs, const Next& next) override {
    std::vector<dist::Work> works;
    for (auto& b : buffers_) works.push_back(impl_->group.broadcast(b, 0));
    dist::wait_all(works);
    return next(std::move(inputs));
  }
  std::string name() const override { return "replicate"; }

 private:
  std::shared_ptr<Ddp::Impl> impl_;
  std::vector<at::Tensor> buffers_;  // empty when buffers are not broadcast
};

}  // namespace

Ddp replicate(const std::shared_ptr<torch::nn::Module>& module, const dist::Communicator& group,
              const DdpOptions& options) {
  if (!module) throw std::invalid_argument("replicate: null module");
  if (!(options.bucket_cap_mb > 0)) {
    throw std::invalid_argument("replicate: bucket_cap_mb = " + std::to_string(options.bucket_cap_mb) +
                                ", expected > 0");
  }
  // A group of one has nothing to average: no buckets are filled, viewed or reduced (gradients stay in .grad as
  // AccumulateGrad left them); what parameters received a gradient is still checked.
  DdpOptions effective = options;
  if (group.size() == 1) effective.gradient_as_bucket_view = false;
  auto impl = std::make_shared<Ddp::Impl>(group, effective);
  // Everyone starts from rank 0's model.
  {
    c10::AutoGradMode no_grad(false);
    std::vector<dist::Work> works;
    for (const auto& p : module->parameters()) works.push_back(group.broadcast(p.detach(), 0));
    for (const auto& b : module->buffers()) works.push_back(group.broadcast(b, 0));
    dist::wait_all(works);
  }
  for (const auto& item : module->named_parameters()) {
    if (!item.value().requires_grad()) continue;
    impl->names.push_back(item.key());
    impl->params.push_back(item.value());
  }
  // Buckets over the parameters in reverse order, each closed once it reaches the cap.
  const auto cap_bytes = static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024);
  impl->bucket_of.resize(impl->params.size());
  impl->offset_in_bucket.resize(impl->params.size());
  int64_t bytes = 0;
  for (size_t n = impl->params.size(); n-- > 0;) {
    const at::Tensor& p = impl->params[n];
    const bool other_dtype =
        !impl->buckets.empty() && p.scalar_type() != impl->params[impl->buckets.back().params.front()].scalar_type();
    if (impl->buckets.empty() || bytes >= cap_bytes || other_dtype) {
      impl->buckets.emplace_back();
      bytes = 0;
    }
    Bucket& b = impl->buckets.back();
    b.params.push_back(n);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
    impl->bucket_of[n] = impl->buckets.size() - 1;
    impl->offset_in_bucket[n] = b.offsets.back();
  }
  impl->has_grad.assign(impl->params.size(), 0);
  if (effective.gradient_as_bucket_view) {
    for (Bucket& b : impl->buckets) {
      b.flat = at::zeros({b.numel}, impl->params[b.params.front()].options().requires_grad(false));
    }
  }
  std::weak_ptr<Ddp::Impl> weak = impl;
  for (size_t i = 0; i < impl->params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(impl->params[i]);
    accumulator->add_post_hook(std::make_unique<nn::AfterAccumulate>([weak, i] {
      if (auto self = weak.lock()) self->on_gradient(i);
    }));
    impl->accumulators.push_back(std::move(accumulator));
  }
  if (nn::InterceptPoint* point = nn::as_intercept_point(*module)) {
    std::vector<at::Tensor> buffers;
    if (options.broadcast_buffers && group.size() > 1) buffers = module->buffers();
    point->interceptors().add(std::make_shared<ReplicateInterceptor>(impl, std::move(buffers)));
  }
  return Ddp(impl);
}

void Ddp::set_requires_gradient_sync(bool sync) { impl_->sync = sync; }

std::vector<std::vector<std::string>> Ddp::buckets() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(impl_->names[i]);
  }
  return out;
}

int64_t Ddp::all_reduces() const { return impl_->all_reduces; }

}  // namespace shardtrain::ddp
