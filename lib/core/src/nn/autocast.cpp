#include "shardtrain/nn/autocast.h"

#include <torch/nn/module.h>

#include <stdexcept>
#include <string>

#include "nn/autocast_guard.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::nn {
namespace {

class AutocastInterceptor : public Interceptor {
 public:
  AutocastInterceptor(c10::DeviceType device_type, c10::ScalarType dtype) : device_type_(device_type), dtype_(dtype) {}

  TensorVec around(torch::nn::Module&, TensorVec inputs, const Next& next) override {
    TensorVec outputs;
    {
      AutocastGuard guard(device_type_, true, dtype_);
      outputs = next(std::move(inputs));
    }
    for (auto& out : outputs) {
      if (out.defined() && out.is_floating_point() && out.scalar_type() != at::kFloat) out = out.to(at::kFloat);
    }
    return outputs;
  }
  std::string name() const override { return "autocast"; }

 private:
  c10::DeviceType device_type_;
  c10::ScalarType dtype_;
};

}  // namespace

void autocast_module(torch::nn::Module& module, c10::DeviceType device_type, c10::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    throw std::invalid_argument(std::string("autocast_module: dtype ") + c10::toString(dtype) +
                                ", expected BFloat16 or Half");
  }
  InterceptPoint* point = as_intercept_point(module);
  if (!point) {
    throw std::invalid_argument("autocast_module: class " + module.name() +
                                " does not derive from shardtrain::nn::Interceptable");
  }
  point->interceptors().add(std::make_shared<AutocastInterceptor>(device_type, dtype));
}

}  // namespace shardtrain::nn
