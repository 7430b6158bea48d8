// GradScaler in one process: with finite gradients a scaled step is bit for bit the plain step (power-of-two
// scales); an overflowing gradient skips the step and backs the scale off; clean steps grow it; misuse and bad
// options are errors that say what is wrong.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/optim/grad_scaler.h"
#include "support/expect_error.h"

namespace shardtrain::optim {
namespace {

struct Trainee {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

Trainee make() {
  torch::manual_seed(1);
  Trainee s;
  s.model = torch::nn::Linear(5, 3);
  s.optimizer = std::make_unique<torch::optim::AdamW>(s.model->parameters(), torch::optim::AdamWOptions(1e-2));
  return s;
}

at::Tensor loss_of(torch::nn::Linear& model, int step) {
  torch::manual_seed(100 + step);
  return torch::mse_loss(model(torch::randn({8, 5})), torch::randn({8, 3}));
}

TEST(GradScaler, FiniteStepsEqualPlainSteps) {
  Trainee plain = make(), scaled = make();
  GradScaler scaler;
  for (int step = 0; step < 5; ++step) {
    plain.optimizer->zero_grad();
    loss_of(plain.model, step).backward();
    plain.optimizer->step();

    scaled.optimizer->zero_grad();
    scaler.scale(loss_of(scaled.model, step)).backward();
    EXPECT_TRUE(scaler.step(*scaled.optimizer));
    scaler.update();
  }
  auto a = plain.model->parameters(), b = scaled.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  EXPECT_EQ(scaler.scale_value(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 5);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, OverflowSkipsAndBacksOffCleanStepsGrow) {
  Trainee s = make();
  GradScaler scaler(GradScalerOptions{.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5,
                                      .growth_interval = 2});
  const auto before = s.model->weight.detach().clone();
  scaler.scale(loss_of(s.model, 0)).backward();
  s.model->bias.mutable_grad()[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(scaler.step(*s.optimizer));
  scaler.update();
  EXPECT_TRUE(torch::equal(s.model->weight, before)) << "a skipped step moved the parameters";
  EXPECT_EQ(scaler.scale_value(), 512.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (int step = 1; step <= 2; ++step) {  // two clean steps: the scale doubles
    s.optimizer->zero_grad();
    scaler.scale(loss_of(s.model, step)).backward();
    scaler.unscale(*s.optimizer);  // explicit, as before clipping
    EXPECT_TRUE(scaler.step(*s.optimizer));
    scaler.update();
  }
  EXPECT_EQ(scaler.scale_value(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_FALSE(torch::equal(s.model->weight, before));
  // NaN counts as overflow too.
  s.optimizer->zero_grad();
  scaler.scale(loss_of(s.model, 3)).backward();
  s.model->weight.mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.step(*s.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 512.0);
}

TEST(GradScaler, MisuseAndBadOptionsAreErrors) {
  testing::expect_error<std::invalid_argument>([] { GradScaler(GradScalerOptions{.init_scale = 0}); }, {"init_scale"});
  testing::expect_error<std::invalid_argument>([] { GradScaler(GradScalerOptions{.backoff_factor = 1.5}); },
                                               {"backoff_factor = 1.5"});
  testing::expect_error<std::invalid_argument>([] { GradScaler(GradScalerOptions{.growth_interval = 0}); },
                                               {"growth_interval"});
  Trainee s = make();
  GradScaler scaler;
  testing::expect_error<std::logic_error>([&] { scaler.update(); }, {"no step()"});
  scaler.scale(loss_of(s.model, 0)).backward();
  scaler.unscale(*s.optimizer);
  testing::expect_error<std::logic_error>([&] { scaler.unscale(*s.optimizer); }, {"twice"});
  scaler.step(*s.optimizer);
  testing::expect_error<std::logic_error>([&] { scaler.step(*s.optimizer); }, {"twice"});
  scaler.update();
  testing::expect_error<std::invalid_argument>([&] { scaler.load_state(-1, 0); }, {"scale -1"});
  scaler.load_state(256, 7);
  EXPECT_EQ(scaler.scale_value(), 256);
  EXPECT_EQ(scaler.growth_tracker(), 7);
}

}  // namespace
}  // namespace shardtrain::optim
