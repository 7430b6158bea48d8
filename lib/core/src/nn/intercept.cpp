#include "shardtrain/nn/intercept.h"

#include <algorithm>
#include <stdexcept>

namespace shardtrain::nn {

void InterceptorChain::add(std::shared_ptr<Interceptor> interceptor) {
  if (!interceptor) throw std::invalid_argument("InterceptorChain::add: null interceptor");
  auto position = interceptors_.end();
  if (!interceptor->innermost()) {
    position = std::find_if(interceptors_.begin(), interceptors_.end(), [](const auto& i) { return i->innermost(); });
  }
  interceptors_.insert(position, std::move(interceptor));
}

bool InterceptorChain::remove(const Interceptor* interceptor) {
  auto it = std::find_if(interceptors_.begin(), interceptors_.end(),
                         [interceptor](const auto& p) { return p.get() == interceptor; });
  if (it == interceptors_.end()) return false;
  interceptors_.erase(it);
  return true;
}

namespace {

// What every next() of one call shares. The list is a copy, so that an interceptor that adds or removes
// interceptors during a call does not disturb the call in progress (or a later replay of it).
struct Call {
  torch::nn::Module* module;
  std::vector<std::shared_ptr<Interceptor>> chain;
  Interceptor::Next body;
};

// Runs interceptor k of the call, whose next() runs k+1, ..., and finally the body.
TensorVec run_from(const std::shared_ptr<const Call>& call, size_t k, TensorVec inputs) {
  if (k == call->chain.size()) return call->body(std::move(inputs));
  Interceptor::Next next = [call, k](TensorVec next_inputs) { return run_from(call, k + 1, std::move(next_inputs)); };
  return call->chain[k]->around(*call->module, std::move(inputs), next);
}

}  // namespace

TensorVec InterceptorChain::run(torch::nn::Module& module, TensorVec inputs, const Interceptor::Next& body) const {
  auto call = std::make_shared<const Call>(Call{&module, interceptors_, body});
  return run_from(call, 0, std::move(inputs));
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
