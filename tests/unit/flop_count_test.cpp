// The FLOPs the loop divides by time for TFLOP/s and MFU (ModelRecipe::training_flops) against the operations a
// training step really runs, counted op by op (nn::FlopCounter): for every family's debug flavor on a synthetic
// batch of each kind it reads, the layers' forward FLOPs counted during the real forward, times 3, equal the formula
// (which counts the transformer layers only: the 6N convention), and the backward counted is at least twice them.
// The counter itself is checked on ops whose FLOPs are worked out by hand.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/models/synthetic_batch.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/nn/flop_counter.h"
#include "shardtrain/nn/intercept.h"

namespace shardtrain::nn {
namespace {

TEST(FlopCounter, CountsProductsConvolutionsAndAttentionByHand) {
  FlopCounter outer;
  at::Tensor a = torch::randn({3, 4}), b = torch::randn({4, 5});
  at::mm(a, b);                                              // 2 * 3 * 4 * 5
  at::addmm(torch::zeros({5}), a, b);                        // the same
  at::bmm(torch::randn({2, 3, 4}), torch::randn({2, 4, 5}));  // 2 * 2 * 3 * 4 * 5
  double expected = 120 + 120 + 240;
  EXPECT_DOUBLE_EQ(outer.total(), expected);
  {
    FlopCounter inner;  // nested: counts its own ops, and the outer counts them too
    at::linear(torch::randn({2, 3, 4}), torch::randn({5, 4}), torch::zeros({5}));  // (6, 4) x (4, 5) folded
    EXPECT_DOUBLE_EQ(inner.total(), 240);
  }
  expected += 240;
  EXPECT_DOUBLE_EQ(outer.total(), expected);

  // A convolution, (2, 3, 8, 8) by (4, 3, 3, 3), stride 2, padding 1: output (2, 4, 4, 4), 27 weights each.
  at::Tensor w = torch::randn({4, 3, 3, 3}, torch::requires_grad());
  at::Tensor y = at::conv2d(torch::randn({2, 3, 8, 8}), w, {}, /*stride=*/2, /*padding=*/1);
  expected += 2.0 * 128 * 27;
  EXPECT_DOUBLE_EQ(outer.total(), expected);
  y.sum().backward();  // the weight's gradient only: the input needs none
  expected += 2.0 * 128 * 27;
  EXPECT_DOUBLE_EQ(outer.total(), expected);

  // Linear backward: both gradients, each one forward's worth.
  at::Tensor x = torch::randn({6, 4}, torch::requires_grad()), v = torch::randn({5, 4}, torch::requires_grad());
  at::linear(x, v).sum().backward();
  expected += 3 * 240.0;
  EXPECT_DOUBLE_EQ(outer.total(), expected);

  // Attention, q, k, v (1, 2, 5, 8): 2 * 2 * 5 * 5 * (8 + 8) forward, twice that backward — through the fused kernel
  // or the math path's products alike.
  at::Tensor q = torch::randn({1, 2, 5, 8}, torch::requires_grad());
  at::Tensor k = torch::randn({1, 2, 5, 8}, torch::requires_grad()), u = torch::randn({1, 2, 5, 8}, torch::requires_grad());
  at::Tensor o = at::scaled_dot_product_attention(q, k, u);
  expected += 1600;
  EXPECT_DOUBLE_EQ(outer.total(), expected);
  o.sum().backward();
  expected += 3200;
  EXPECT_DOUBLE_EQ(outer.total(), expected) << c10::str(outer.by_op());

  at::relu(a);
  at::softmax(a, 1);  // elementwise and reductions count nothing
  EXPECT_DOUBLE_EQ(outer.total(), expected);
}

// Adds the FLOPs counted during each call of the module it wraps into `sum`.
class CountCalls : public Interceptor {
 public:
  CountCalls(const FlopCounter& counter, double& sum) : counter_(counter), sum_(sum) {}
  TensorVec around(torch::nn::Module&, TensorVec inputs, const Next& next) override {
    const double before = counter_.total();
    TensorVec out = next(std::move(inputs));
    sum_ += counter_.total() - before;
    return out;
  }
  std::string name() const override { return "count calls"; }

 private:
  const FlopCounter& counter_;
  double& sum_;
};

TEST(TrainingFlops, MatchTheOperationsCounted) {
  for (const std::string flavor : {"bert-debug", "vit-debug", "t5-debug", "llama-debug", "gpt2-debug", "flava-debug"}) {
    const auto recipe = models::recipe_of(flavor);
    const auto task = recipe->task();
    models::ZooModel model = models::build_model(recipe);
    for (int kind = 0; kind < 3; ++kind) {
      models::DataNeeds needs = task->data_needs();
      if (!needs.kinds[static_cast<size_t>(kind)]) continue;
      needs.kinds = {kind == 0, kind == 1, kind == 2};
      SCOPED_TRACE(flavor + " batch kind " + std::to_string(kind));
      const data::Batch batch = models::synthetic_batch(needs, 2, 16, 7);
      FlopCounter counter;
      double layers = 0;
      std::vector<std::pair<InterceptPoint*, std::shared_ptr<Interceptor>>> added;
      for (const auto& [name, module] : intercept_points(model.module)) {
        if (fsdp::module_class_name(*module) != recipe->layer_class()) continue;
        auto* point = dynamic_cast<InterceptPoint*>(module.get());
        added.emplace_back(point, std::make_shared<CountCalls>(counter, layers));
        point->interceptors().add(added.back().second);
      }
      ASSERT_FALSE(added.empty());
      const models::Losses losses = task->compute_losses(*model.module, batch, 7);
      const double forward = counter.total(), layers_forward = layers;
      losses.total.backward();
      const double backward = counter.total() - forward;
      for (auto& [point, interceptor] : added) point->interceptors().remove(interceptor.get());
      model.module->zero_grad();

      const double formula = recipe->training_flops(batch);
      EXPECT_NEAR(3 * layers_forward, formula, 1e-9 * formula) << "counted " << layers_forward << " in the layers";
      EXPECT_GE(backward, 2 * layers_forward * (1 - 1e-9));
      std::cout << flavor << " kind " << kind << ": formula " << formula << " FLOPs, counted " << counter.total()
                << " (the layers " << 100 * formula / counter.total() << "%; forward " << forward << ", backward "
                << backward << ")" << std::endl;
    }
  }
}

}  // namespace
}  // namespace shardtrain::nn
