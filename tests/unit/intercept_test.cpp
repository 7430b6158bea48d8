// The interception point: a layer opts in with its base class; parents do not change; it works through typed
// members, torch::nn::Sequential and ModuleList; interceptors compose in order; tensor inputs and outputs can be
// replaced; non-tensor arguments pass through; gradients flow.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include "shardtrain/nn/intercept.h"

namespace shardtrain::nn {
namespace {

struct MlpImpl : Interceptable<MlpImpl, at::Tensor(at::Tensor)> {
  explicit MlpImpl(int64_t dim) : fc(register_module("fc", torch::nn::Linear(dim, dim))) {}
  at::Tensor forward_impl(at::Tensor x) { return torch::relu(fc->forward(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Mlp);

// Two tensors and a scalar in, two tensors out.
struct MixImpl : Interceptable<MixImpl, std::tuple<at::Tensor, at::Tensor>(at::Tensor, double, const at::Tensor&)> {
  std::tuple<at::Tensor, at::Tensor> forward_impl(at::Tensor a, double scale, const at::Tensor& b) {
    return {a * scale + b, a - b};
  }
};
TORCH_MODULE(Mix);

// A parent that calls its children through typed members, as LibTorch models do; it knows nothing of interception.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    first = register_module("first", Mlp(4));
    second = register_module("second", Mlp(4));
  }
  at::Tensor forward(at::Tensor x) { return second(first(x)); }
  Mlp first{nullptr}, second{nullptr};
};
TORCH_MODULE(Net);

// Logs its pre and post moments into a shared journal.
struct Recorder : Interceptor {
  Recorder(std::string tag, std::vector<std::string>* journal) : tag_(std::move(tag)), journal_(journal) {}
  TensorVec around(torch::nn::Module& module, TensorVec inputs, const Next& next) override {
    std::string type = module.name();  // the qualified class name; keep the last component
    type = type.substr(type.rfind("::") == std::string::npos ? 0 : type.rfind("::") + 2);
    journal_->push_back(tag_ + ".pre(" + type + ")");
    TensorVec out = next(std::move(inputs));
    journal_->push_back(tag_ + ".post");
    return out;
  }
  std::string name() const override { return tag_; }
  std::string tag_;
  std::vector<std::string>* journal_;
};

// Scales every tensor input.
struct ScaleInputs : Interceptor {
  explicit ScaleInputs(double f) : factor(f) {}
  TensorVec around(torch::nn::Module&, TensorVec inputs, const Next& next) override {
    for (auto& t : inputs) t = t * factor;
    return next(std::move(inputs));
  }
  std::string name() const override { return "scale"; }
  double factor;
};

TEST(Intercept, WithoutInterceptorsTheBodyRunsAsIs) {
  torch::manual_seed(0);
  Mlp mlp(4);
  at::Tensor x = torch::randn({2, 4});
  EXPECT_TRUE(torch::equal(mlp(x), torch::relu(mlp->fc(x))));
}

TEST(Intercept, InterceptorsComposeOutermostFirst) {
  Mlp mlp(4);
  std::vector<std::string> journal;
  mlp->interceptors().add(std::make_shared<Recorder>("A", &journal));
  mlp->interceptors().add(std::make_shared<Recorder>("B", &journal));
  mlp(torch::randn({1, 4}));
  EXPECT_EQ(journal, (std::vector<std::string>{"A.pre(MlpImpl)", "B.pre(MlpImpl)", "B.post", "A.post"}));
}

TEST(Intercept, ParentsCallingTypedMembersAreIntercepted) {
  torch::manual_seed(0);
  Net net;
  std::vector<std::string> journal;
  net->first->interceptors().add(std::make_shared<Recorder>("first", &journal));
  net->second->interceptors().add(std::make_shared<Recorder>("second", &journal));
  at::Tensor x = torch::randn({3, 4});
  at::Tensor expected = torch::relu(net->second->fc(torch::relu(net->first->fc(x))));
  EXPECT_TRUE(torch::allclose(net(x), expected));
  EXPECT_EQ(journal, (std::vector<std::string>{"first.pre(MlpImpl)", "first.post", "second.pre(MlpImpl)",
                                               "second.post"}));
}

TEST(Intercept, InsideSequentialAndModuleList) {
  torch::manual_seed(0);
  Mlp a(4), b(4);
  torch::nn::Sequential seq(a, b);
  torch::nn::ModuleList list(a, b);
  std::vector<std::string> journal;
  a->interceptors().add(std::make_shared<Recorder>("a", &journal));
  b->interceptors().add(std::make_shared<Recorder>("b", &journal));
  at::Tensor x = torch::randn({2, 4});
  at::Tensor through_seq = seq->forward(x);
  at::Tensor through_list = x;
  for (const auto& m : *list) through_list = m->as<MlpImpl>()->forward(through_list);
  EXPECT_TRUE(torch::equal(through_seq, through_list));
  EXPECT_EQ(journal.size(), 8u);
  EXPECT_EQ(journal.front(), "a.pre(MlpImpl)");
  EXPECT_EQ(journal[3], "b.post");
}

TEST(Intercept, InputsCanBeReplacedAndNonTensorsPassThrough) {
  Mix mix;
  mix->interceptors().add(std::make_shared<ScaleInputs>(10.0));
  at::Tensor a = torch::full({2}, 1.0), b = torch::full({2}, 2.0);
  auto [sum, diff] = mix(a, 3.0, b);  // body sees a=10, b=20; scale stays 3
  EXPECT_TRUE(torch::equal(sum, torch::full({2}, 10.0 * 3 + 20.0)));
  EXPECT_TRUE(torch::equal(diff, torch::full({2}, 10.0 - 20.0)));
}

TEST(Intercept, GradientsFlowThroughInterceptors) {
  torch::manual_seed(0);
  Mlp plain(4), wrapped(4);
  torch::NoGradGuard no_grad;
  wrapped->fc->weight.copy_(plain->fc->weight);
  wrapped->fc->bias.copy_(plain->fc->bias);
  {
    torch::AutoGradMode grad_on(true);
    std::vector<std::string> journal;
    wrapped->interceptors().add(std::make_shared<Recorder>("r", &journal));
    at::Tensor x = torch::randn({5, 4});
    plain(x).sum().backward();
    wrapped(x).sum().backward();
  }
  EXPECT_TRUE(torch::equal(plain->fc->weight.grad(), wrapped->fc->weight.grad()));
}

TEST(Intercept, FindsEveryInterceptPointOfAModel) {
  Net net;
  auto points = intercept_points(net.ptr());
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].first, "first");
  EXPECT_EQ(points[1].first, "second");
  EXPECT_EQ(as_intercept_point(*net->first->fc), nullptr);  // a plain Linear does not opt in
  Recorder r("x", nullptr);
  EXPECT_FALSE(net->first->interceptors().remove(&r));
}

}  // namespace
}  // namespace shardtrain::nn
