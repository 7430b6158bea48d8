#include "shardtrain/nn/intercept.h"

#include <algorithm>
#include <stdexcept>

namespace shardtrain::nn {

void InterceptorChain::add(std::shared_ptr<Interceptor> interceptor) {
  if (!interceptor) throw std::invalid_argument("InterceptorChain::add: null interceptor");
  interceptors_.push_back(std::move(interceptor));
}

bool InterceptorChain::remove(const Interceptor* interceptor) {
  auto it = std::find_if(interceptors_.begin(), interceptors_.end(),
                         [interceptor](const auto& p) { return p.get() == interceptor; });
  if (it == interceptors_.end()) return false;
  interceptors_.erase(it);
  return true;
}

TensorVec InterceptorChain::run(torch::nn::Module& module, TensorVec inputs, const Interceptor::Next& body) const {
  // Interceptor k's next() runs interceptor k+1, ..., and finally the body. The list is copied so that an
  // interceptor that adds or removes interceptors during a call does not disturb the call in progress.
  auto chain = std::make_shared<const std::vector<std::shared_ptr<Interceptor>>>(interceptors_);
  std::function<TensorVec(size_t, TensorVec)> step = [&](size_t k, TensorVec in) -> TensorVec {
    if (k == chain->size()) return body(std::move(in));
    Interceptor& current = *(*chain)[k];
    return current.around(module, std::move(in), [&step, k](TensorVec next_in) { return step(k + 1, std::move(next_in)); });
  };
  return step(0, std::move(inputs));
}

InterceptPoint* as_intercept_point(torch::nn::Module& module) { return dynamic_cast<InterceptPoint*>(&module); }

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> intercept_points(
    const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> points;
  for (const auto& item : root->named_modules()) {
    if (as_intercept_point(*item.value())) points.emplace_back(item.key(), item.value());
  }
  return points;
}

}  // namespace shardtrain::nn
