#include "shardtrain/nn/activation_offload.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "nn/saved_activation.h"
#include "nn/storage_copy.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::nn {
namespace {

// A parameter (a tensor on one's storage: a view, frozen or not), autocast's cast of one, or a leaf that requires a
// gradient (the caller's input, or a view of it): each lives on the device whatever offloading does (FSDP frees a
// gathered parameter's storage itself; the caller holds its input to backward), so it stays. Leaves that do not
// require a gradient are not all parameters: the non-differentiable outputs an op saves (a norm's mean and inverse
// deviation, attention's log-sum-exp) have no history yet when saved.
bool parameter_like(const at::Tensor& t, const std::vector<const c10::StorageImpl*>& parameters) {
  if (std::find(parameters.begin(), parameters.end(), t.storage().unsafeGetStorageImpl()) != parameters.end()) {
    return true;
  }
  const at::Tensor base = t.is_view() ? at::Tensor(t._base()) : t;
  if (base.is_leaf() && base.requires_grad()) return true;
  // A cast: a chain of one-input nodes from a parameter's accumulator (a view of it, GPT-2's transposed Conv1D
  // weight; the cast) with a ToCopyBackward0 among them.
  bool cast = false;
  const torch::autograd::Node* node = base.grad_fn().get();
  for (int depth = 0; node != nullptr && depth < 4; ++depth) {
    if (node->name() == "torch::autograd::AccumulateGrad") return cast;
    cast = cast || node->name() == "ToCopyBackward0";
    if (node->next_edges().size() != 1) return false;
    node = node->next_edges()[0].function.get();
  }
  return false;
}

bool offloadable(const at::Tensor& t, const std::vector<const c10::StorageImpl*>& parameters) {
  return t.defined() && t.layout() == at::kStrided && t.has_storage() && !t.is_meta() &&
         (t.is_cpu() || t.is_cuda()) && t.storage().nbytes() > 0 && !parameter_like(t, parameters);
}

}  // namespace

class Offloader;

// One call of an offloaded module in forward, and the copies of what it saved. Lives as long as a saved tensor of
// it does (autograd frees them as backward passes the call). Its copies are in host memory alone until backward
// reaches it or the call after it; then also on the device, until backward reaches a call before its predecessor.
class OffloadCall {
 public:
  OffloadCall(std::shared_ptr<Offloader> offloader, std::vector<const c10::StorageImpl*> parameters)
      : offloader_(std::move(offloader)), parameters_(std::move(parameters)) {}
  // The storages of the module's parameters as the call began (gathered, under FSDP).
  const std::vector<const c10::StorageImpl*>& parameters() const { return parameters_; }
  // The copy of `t`'s storage, now among the call's.
  std::shared_ptr<StorageCopy> copy(const at::Tensor& t);
  // One of its copies on the device.
  at::Tensor restored(StorageCopy& copy);

 private:
  friend class Offloader;
  std::shared_ptr<Offloader> offloader_;
  std::vector<const c10::StorageImpl*> parameters_;
  std::vector<std::weak_ptr<StorageCopy>> copies_;  // guarded by the offloader's mutex
  bool entered_ = false;                            // backward has asked for one of its tensors
};

// The schedule the offloaded modules of one model share: their calls in forward order, so that backward, reaching
// one, brings back the one before it and lets go of those after it; and the copies the calls made, so that a
// storage several calls save (the rotary tables, the attention mask every layer is given) is copied once.
class Offloader : public std::enable_shared_from_this<Offloader> {
 public:
  std::shared_ptr<OffloadCall> begin_call(std::vector<const c10::StorageImpl*> parameters) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.erase(std::remove_if(calls_.begin(), calls_.end(), [](const auto& c) { return c.expired(); }),
                 calls_.end());
    copies_.erase(std::remove_if(copies_.begin(), copies_.end(), [](const auto& c) { return c.expired(); }),
                  copies_.end());
    auto call = std::make_shared<OffloadCall>(shared_from_this(), std::move(parameters));
    calls_.push_back(call);
    return call;
  }

  // The copy of `t`'s storage: one made before (by any call of this forward) while the storage still holds what it
  // held then, else a new one.
  std::shared_ptr<StorageCopy> copy_locked(const at::Tensor& t) {
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const uint32_t version = t._version();
    for (const auto& weak : copies_) {
      auto c = weak.lock();
      if (c && c->source._unsafe_get_target() == storage && c->version == version) return c;
    }
    auto c = std::make_shared<StorageCopy>(stream_.to_host(t));
    copies_.push_back(c);
    return c;
  }

  // Backward reached `call` for the first time: the calls after it in forward are done (their copies leave the
  // device but for those this call or the one before it shares), it comes back and so does the call before it.
  void enter_locked(OffloadCall& call) {
    call.entered_ = true;
    auto at = std::find_if(calls_.begin(), calls_.end(), [&](const auto& c) { return c.lock().get() == &call; });
    std::vector<std::shared_ptr<StorageCopy>> wanted;
    auto want = [&wanted](const OffloadCall& c) {
      for (const auto& weak : c.copies_) {
        if (auto copy = weak.lock()) wanted.push_back(std::move(copy));
      }
    };
    want(call);
    if (at != calls_.end() && at != calls_.begin()) {
      if (auto before = (at - 1)->lock()) want(*before);
    }
    if (at != calls_.end()) {
      for (auto later = at + 1; later != calls_.end(); ++later) {
        auto c = later->lock();
        if (!c) continue;
        for (const auto& weak : c->copies_) {
          auto copy = weak.lock();
          if (copy && std::find(wanted.begin(), wanted.end(), copy) == wanted.end()) copy->restored = at::Tensor();
        }
      }
    }
    for (const auto& c : wanted) stream_.to_device(*c);
  }

  std::mutex mutex_;
  CopyStream stream_;  // guarded by the mutex

 private:
  std::vector<std::weak_ptr<OffloadCall>> calls_;    // this forward's calls, oldest first (expired ones pruned)
  std::vector<std::weak_ptr<StorageCopy>> copies_;  // the copies alive, oldest first
};

std::shared_ptr<StorageCopy> OffloadCall::copy(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(offloader_->mutex_);
  std::shared_ptr<StorageCopy> c = offloader_->copy_locked(t);
  const bool listed = std::any_of(copies_.begin(), copies_.end(), [&](const auto& w) { return w.lock() == c; });
  if (!listed) copies_.push_back(c);
  return c;
}

at::Tensor OffloadCall::restored(StorageCopy& copy) {
  std::lock_guard<std::mutex> lock(offloader_->mutex_);
  if (!entered_) offloader_->enter_locked(*this);
  // (Brought back again if let go of before backward was done with it: a call reached out of order.)
  return offloader_->stream_.ready(copy);
}

namespace {

// The offloaded call running on this thread, if any (scopes nest: a module inside another offloads into its own).
thread_local std::shared_ptr<OffloadCall>* running_call = nullptr;

class RunningCall {
 public:
  explicit RunningCall(std::shared_ptr<OffloadCall> call) : call_(std::move(call)), previous_(running_call) {
    running_call = &call_;
  }
  ~RunningCall() { running_call = previous_; }
  RunningCall(const RunningCall&) = delete;
  RunningCall& operator=(const RunningCall&) = delete;

 private:
  std::shared_ptr<OffloadCall> call_;
  std::shared_ptr<OffloadCall>* previous_;
};

}  // namespace

SavedActivation SavedActivation::keep(const at::Tensor& t) {
  SavedActivation s;
  if (!t.defined()) return s;
  s.version_ = t.unsafeGetTensorImpl()->version_counter();
  s.saved_version_ = t._version();
  if (running_call == nullptr || !offloadable(t, (*running_call)->parameters())) {
    s.kept_ = t.detach();
    return s;
  }
  s.call_ = *running_call;
  s.copy_ = s.call_->copy(t);
  s.dtype_ = t.scalar_type();
  s.sizes_ = t.sizes().vec();
  s.strides_ = t.strides().vec();
  s.offset_ = t.storage_offset();
  return s;
}

uint32_t SavedActivation::current_version() const { return version_ ? version_->current_version() : 0; }

at::Tensor SavedActivation::get() const {
  if (kept_.defined()) return kept_;
  if (!call_) throw std::logic_error("SavedActivation::get: nothing was kept");
  const at::Tensor bytes = call_->restored(*copy_);
  return at::empty({0}, bytes.options().dtype(dtype_)).set_(bytes.storage(), offset_, sizes_, strides_);
}

namespace {

// What an offloaded call's saved variables hold: the tensor through SavedActivation (offloaded or, for parameters,
// kept), checked against in-place changes on the way back as autograd checks a tensor it holds itself.
class OffloadHooks : public torch::autograd::SavedVariableHooks {
 public:
  void call_pack_hook(const at::Tensor& tensor) override { saved_ = SavedActivation::keep(tensor); }
  at::Tensor call_unpack_hook() override {
    if (saved_.current_version() != saved_.saved_version()) {
      throw std::runtime_error(
          "one of the variables needed for gradient computation has been modified by an inplace operation "
          "(version " + std::to_string(saved_.saved_version()) + " when an activation-offloaded call saved it, " +
          std::to_string(saved_.current_version()) + " now)");
    }
    return saved_.get();
  }

 private:
  SavedActivation saved_;
};

// LibTorch's engine, answering the saved-variable hooks question: ours while an offloaded call runs on the asking
// thread (the thread that runs forward), none otherwise — which is what its own engine answers always.
class OffloadingEngine : public torch::autograd::Engine {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (running_call == nullptr) return nullptr;
    return std::make_unique<OffloadHooks>();
  }
  ~OffloadingEngine() override { stop(); }
};

torch::autograd::Engine& offloading_engine() {
  // Never destroyed: worker threads may outlive static destruction (as LibTorch's own engine, a static it leaks).
  static auto* engine = new OffloadingEngine();
  return *engine;
}

void install_offloading_engine() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::autograd::Engine& current = torch::autograd::Engine::get_default_engine();
    if (&current != &torch::autograd::Engine::get_base_engine()) {
      throw std::runtime_error("activation offloading: the autograd engine is not LibTorch's own (Python's "
                               "bindings replaced it in this process); offload with "
                               "torch.autograd.graph.save_on_cpu there");
    }
    torch::autograd::set_default_engine_stub(&offloading_engine);
  });
}

class OffloadInterceptor : public Interceptor {
 public:
  explicit OffloadInterceptor(std::shared_ptr<Offloader> offloader) : offloader_(std::move(offloader)) {}

  TensorVec around(torch::nn::Module& module, TensorVec inputs, const Next& next) override {
    if (!at::GradMode::is_enabled()) return next(std::move(inputs));
    std::vector<const c10::StorageImpl*> parameters;
    for (const at::Tensor& p : module.parameters()) {
      if (p.has_storage()) parameters.push_back(p.storage().unsafeGetStorageImpl());
    }
    RunningCall call(offloader_->begin_call(std::move(parameters)));
    return next(std::move(inputs));
  }

  std::string name() const override { return "activation_offload"; }

 private:
  std::shared_ptr<Offloader> offloader_;
};

const OffloadInterceptor* offload_of(torch::nn::Module& module) {
  return interceptor_of<const OffloadInterceptor>(module);
}

}  // namespace

std::vector<std::string> apply_activation_offloading(
    const std::shared_ptr<torch::nn::Module>& root,
    const std::function<bool(const std::string& name, torch::nn::Module& module)>& select) {
  if (!root) throw std::invalid_argument("apply_activation_offloading: null module");
  std::vector<std::string> names;
  std::vector<InterceptPoint*> points;
  for (const auto& item : root->named_modules()) {
    if (!select(item.key(), *item.value())) continue;
    const std::string label = item.key().empty() ? item.value()->name() : item.key();
    InterceptPoint* point = as_intercept_point(*item.value());
    if (!point) {
      throw std::invalid_argument("apply_activation_offloading(" + label + "): class " + item.value()->name() +
                                  " does not derive from shardtrain::nn::Interceptable, so its calls cannot be "
                                  "intercepted; offload a module that does (e.g. the transformer layer)");
    }
    if (offload_of(*item.value())) {
      throw std::invalid_argument("apply_activation_offloading(" + label + "): the module offloads already");
    }
    names.push_back(item.key());
    points.push_back(point);
  }
  if (points.empty()) return names;
  install_offloading_engine();
  auto offloader = std::make_shared<Offloader>();
  for (InterceptPoint* point : points) point->interceptors().add(std::make_shared<OffloadInterceptor>(offloader));
  return names;
}

bool is_activation_offloaded(torch::nn::Module& module) { return offload_of(module) != nullptr; }

bool remove_activation_offload(torch::nn::Module& module) {
  const OffloadInterceptor* o = offload_of(module);
  return o && as_intercept_point(module)->interceptors().remove(o);
}

}  // namespace shardtrain::nn
