// The call-interception point LibTorch lacks (docs/notes/libtorch.md §8): a module's call can be wrapped from
// outside by interceptors — sharding (unshard before, reshard after), activation checkpointing, autocast, tracing —
// without its parent changing. A layer opts in by deriving from Interceptable with its forward signature and
// naming its body forward_impl:
//
//   struct BlockImpl : shardtrain::nn::Interceptable<BlockImpl, at::Tensor(at::Tensor)> {
//     at::Tensor forward_impl(at::Tensor x);   // the layer's own computation, unchanged
//   };
//   TORCH_MODULE(Block);
//
// Block's forward() is then a plain (non-template) member, so it works called through a typed member
// (`block->forward(x)`, `block(x)`), inside torch::nn::Sequential (AnyModule takes &BlockImpl::forward) and
// ModuleList. Several interceptors compose on one call: the first added is the outermost.
//
// Interceptors see the call's tensor arguments as a flat list (non-tensor arguments pass through unchanged) and the
// outputs as a flat list: forward may return at::Tensor, std::tuple of tensors, or std::vector<at::Tensor>.
//
// next() owns what it needs (copies of the call's non-tensor arguments, the chain as it was at the call), so an
// interceptor may keep it and call it again after around() returned: activation checkpointing replays the body in
// backward (nn/activation_checkpoint.h).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardtrain::nn {

using TensorVec = std::vector<at::Tensor>;

class Interceptor {
 public:
  // Runs the rest of the chain and the module's body on (possibly replaced) tensor inputs. Valid after the call.
  using Next = std::function<TensorVec(TensorVec)>;
  virtual ~Interceptor() = default;
  // Wraps one call of `module`. Must return outputs with the same count and order as next() returns.
  virtual TensorVec around(torch::nn::Module& module, TensorVec inputs, const Next& next) = 0;
  virtual std::string name() const = 0;
  // True for an interceptor that replays next() later (activation checkpointing): it sits inside every other
  // interceptor of the module whatever the order they were added in, so that a replay runs the body only — not
  // sharding's gathers or replication's broadcasts a second time.
  virtual bool innermost() const { return false; }
};

// A module's interceptors, outermost first.
class InterceptorChain {
 public:
  // Becomes the innermost, except that it goes outside any innermost() interceptor when it is not one itself.
  void add(std::shared_ptr<Interceptor> interceptor);
  bool remove(const Interceptor* interceptor);          // false when absent
  bool empty() const { return interceptors_.empty(); }
  const std::vector<std::shared_ptr<Interceptor>>& list() const { return interceptors_; }
  // Runs the chain around `body`.
  TensorVec run(torch::nn::Module& module, TensorVec inputs, const Interceptor::Next& body) const;

 private:
  std::vector<std::shared_ptr<Interceptor>> interceptors_;
};

// What the runtime looks for when it walks a model: every Interceptable is an InterceptPoint.
class InterceptPoint {
 public:
  virtual ~InterceptPoint() = default;
  InterceptorChain& interceptors() { return chain_; }
  const InterceptorChain& interceptors() const { return chain_; }

 private:
  InterceptorChain chain_;
};

// The modules of `root` (itself included, name "") that can be intercepted, in named_modules() order.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> intercept_points(
    const std::shared_ptr<torch::nn::Module>& root);

// The InterceptPoint of a module, or nullptr when its class does not opt in.
InterceptPoint* as_intercept_point(torch::nn::Module& module);

// The module's interceptor of class T, or nullptr when it has none (or cannot be intercepted).
template <class T>
T* interceptor_of(torch::nn::Module& module) {
  InterceptPoint* point = as_intercept_point(module);
  if (point == nullptr) return nullptr;
  for (const auto& interceptor : point->interceptors().list()) {
    if (auto* found = dynamic_cast<T*>(interceptor.get())) return found;
  }
  return nullptr;
}

namespace detail {

template <class T>
constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;

template <class T>
struct Outputs;  // flattening of a forward's result

template <>
struct Outputs<at::Tensor> {
  static TensorVec flatten(at::Tensor t) { return {std::move(t)}; }
  static at::Tensor unflatten(TensorVec v) { return std::move(v.at(0)); }
};

template <>
struct Outputs<std::vector<at::Tensor>> {
  static TensorVec flatten(std::vector<at::Tensor> v) { return v; }
  static std::vector<at::Tensor> unflatten(TensorVec v) { return v; }
};

template <class... Ts>
struct Outputs<std::tuple<Ts...>> {
  static_assert((is_tensor_v<Ts> && ...), "an intercepted forward may return a tuple of tensors only");
  static TensorVec flatten(std::tuple<Ts...> t) {
    return std::apply([](auto&&... x) { return TensorVec{std::move(x)...}; }, std::move(t));
  }
  static std::tuple<Ts...> unflatten(TensorVec v) {
    return unflatten_impl(std::move(v), std::index_sequence_for<Ts...>{});
  }
  template <size_t... I>
  static std::tuple<Ts...> unflatten_impl(TensorVec v, std::index_sequence<I...>) {
    return std::tuple<Ts...>(std::move(v.at(I))...);
  }
};

// The tensor arguments of a call, in order.
template <class... Args>
TensorVec collect_tensors(const Args&... args) {
  TensorVec out;
  auto take = [&out](const auto& a) {
    if constexpr (is_tensor_v<decltype(a)>) out.push_back(a);
  };
  (take(args), ...);
  return out;
}

// How many of Args[0..I) are tensors: the position of argument I's replacement in the interceptors' list.
template <size_t I, class... Args>
constexpr size_t tensors_before() {
  constexpr bool is_tensor[] = {is_tensor_v<Args>..., false};
  size_t n = 0;
  for (size_t k = 0; k < I; ++k) n += is_tensor[k] ? 1 : 0;
  return n;
}

}  // namespace detail

template <class Derived, class Signature>
class Interceptable;

template <class Derived, class R, class... Args>
class Interceptable<Derived, R(Args...)> : public torch::nn::Module, public InterceptPoint {
  static_assert((!std::is_same_v<Args, at::Tensor&> && ...),
                "intercepted tensor arguments are taken by value or const reference");

 public:
  using torch::nn::Module::Module;

  R forward(Args... args) {
    Derived& self = static_cast<Derived&>(*this);
    if (interceptors().empty()) return self.forward_impl(std::forward<Args>(args)...);
    // The body keeps copies of the non-tensor arguments, so it can be replayed after this call returned; the
    // module outlives its calls. The tensor arguments come from the interceptors each time: the body holds none
    // (an offloaded checkpoint's input lives in host memory until its replay, nn/activation_offload.h).
    auto originals = std::make_shared<Originals>(args...);
    drop_tensors(*originals, std::index_sequence_for<Args...>{});
    Interceptor::Next body = [&self, originals](TensorVec inputs) {
      R result = call_with(self, *originals, inputs, std::index_sequence_for<Args...>{});
      return detail::Outputs<R>::flatten(std::move(result));
    };
    return detail::Outputs<R>::unflatten(interceptors().run(*this, detail::collect_tensors(args...), body));
  }

 private:
  using Originals = std::tuple<std::decay_t<Args>...>;

  template <size_t... I>
  static void drop_tensors(Originals& originals, std::index_sequence<I...>) {
    auto drop = [](auto& a) {
      if constexpr (detail::is_tensor_v<decltype(a)>) a = at::Tensor();
    };
    (drop(std::get<I>(originals)), ...);
  }

  // Calls the body with tensor arguments taken from `inputs` (as the interceptors left them) and the others from
  // the original call.
  template <size_t... I>
  static R call_with(Derived& self, Originals& originals, const TensorVec& inputs, std::index_sequence<I...>) {
    return self.forward_impl(argument<I>(originals, inputs)...);
  }

  template <size_t I>
  static decltype(auto) argument(Originals& originals, const TensorVec& inputs) {
    using Arg = std::tuple_element_t<I, std::tuple<Args...>>;
    if constexpr (detail::is_tensor_v<Arg>) {
      return inputs.at(detail::tensors_before<I, Args...>());
    } else {
      return std::get<I>(originals);
    }
  }
};

}  // namespace shardtrain::nn
