// The optimizers against LibTorch's AdamW, step after step, with weight decay groups and parameters without
// gradients: optim::FusedAdamW to float32 rounding (and its fallback to LibTorch's step, AMSGrad);
// optim::AnyPrecisionAdamW bitwise in float32, and with bf16 weights and states, Kahan summation keeping the
// weights near the float32 run where plain bf16 updates round away.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/anyprecision_adamw.h"
#include "shardtrain/optim/optimizer_state.h"
#include "shardtrain/optim/fused_adamw.h"
#include "support/expect_error.h"

namespace shardtrain::optim {
namespace {

std::vector<at::Tensor> make_params(int64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({37, 11}).requires_grad_(), torch::randn({1000}).requires_grad_(),
          torch::randn({}).requires_grad_(), torch::randn({4, 3, 5}).requires_grad_()};
}

// Five steps of `Opt` over two groups (decayed and not); the third parameter gets no gradient on step 2.
template <typename Opt, typename Options>
std::pair<std::vector<at::Tensor>, Opt*> run(Options options, std::unique_ptr<Opt>& keep) {
  std::vector<at::Tensor> params = make_params(7);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]});
  groups.emplace_back(std::vector<at::Tensor>{params[2], params[3]},
                      std::make_unique<Options>(Options(options).weight_decay(0)));
  keep = std::make_unique<Opt>(groups, options);
  torch::manual_seed(11);
  for (int step = 0; step < 5; ++step) {
    keep->zero_grad();
    at::Tensor loss = params[0].pow(2).sum() + params[1].sin().sum() + params[3].pow(3).mean();
    if (step != 2) loss = loss + params[2] * 3;
    loss.backward();
    keep->step();
  }
  return {params, keep.get()};
}

torch::optim::AdamWOptions adamw(bool amsgrad) {
  return torch::optim::AdamWOptions(3e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1).amsgrad(amsgrad);
}

void expect_same(bool amsgrad) {
  std::unique_ptr<torch::optim::AdamW> ref_keep;
  std::unique_ptr<FusedAdamW> fused_keep;
  auto [ref, ref_opt] = run(adamw(amsgrad), ref_keep);
  auto [got, got_opt] = run(adamw(amsgrad), fused_keep);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-5, 1e-6)) << "parameter " << i << " differs by "
                                                              << (got[i] - ref[i]).abs().max().item<double>();
    const auto& a = static_cast<torch::optim::AdamWParamState&>(*ref_opt->state().at(ref[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<torch::optim::AdamWParamState&>(*got_opt->state().at(got[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), b.step()) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(a.exp_avg(), b.exp_avg(), 1e-5, 1e-7)) << "exp_avg of parameter " << i;
    EXPECT_TRUE(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-5, 1e-9)) << "exp_avg_sq of parameter " << i;
  }
}

TEST(FusedAdamW, MatchesLibTorchAdamWStepByStep) { expect_same(/*amsgrad=*/false); }
TEST(FusedAdamW, AmsgradTakesLibTorchsStep) { expect_same(/*amsgrad=*/true); }

TEST(AnyPrecisionAdamW, InFloat32WithoutKahanIsAdamWBitwise) {
  std::unique_ptr<torch::optim::AdamW> ref_keep;
  std::unique_ptr<AnyPrecisionAdamW> any_keep;
  auto [ref, ref_opt] = run(adamw(false), ref_keep);
  auto options = AnyPrecisionAdamWOptions(3e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1);
  options.momentum_dtype(at::kFloat).variance_dtype(at::kFloat);
  auto [got, got_opt] = run(options, any_keep);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i], ref[i])) << "parameter " << i;
    const auto& a = static_cast<torch::optim::AdamWParamState&>(*ref_opt->state().at(ref[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<AnyPrecisionAdamWParamState&>(*got_opt->state().at(got[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), b.step());
    EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg()) && torch::equal(a.exp_avg_sq(), b.exp_avg_sq()));
    EXPECT_FALSE(b.compensation().defined());
  }
}

// Weights in [0.5, 1) have bf16 spacing 2^-8, and updates of lr = 2e-4 are under half of it: plain bf16 AdamW
// rounds every one away and the weights stay where they started, while the float32 run moves them by about 0.045
// (RMS) over 500 steps. Kahan summation keeps what rounding dropped and stays within a rounding of the float32 run
// (measured: 0.003, 15x closer).
TEST(AnyPrecisionAdamW, KahanSummationTracksFloat32WhereBf16Stalls) {
  torch::manual_seed(5);
  const at::Tensor start = torch::rand({4096}) * 0.5 + 0.5;
  std::vector<at::Tensor> grads;
  for (int step = 0; step < 500; ++step) grads.push_back(torch::randn({4096}) + 0.5);  // a drift
  auto train = [&](at::ScalarType dtype, bool kahan) {
    at::Tensor w = start.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
    auto o = AnyPrecisionAdamWOptions(2e-4).use_kahan_summation(kahan);
    o.momentum_dtype(dtype).variance_dtype(dtype).compensation_buffer_dtype(dtype);
    AnyPrecisionAdamW opt({w}, o);
    for (const at::Tensor& g : grads) {
      w.mutable_grad() = g.to(dtype);
      opt.step();
    }
    return w.detach().to(at::kFloat);
  };
  const at::Tensor reference = train(at::kFloat, false);
  auto distance = [&](const at::Tensor& w) { return (w - reference).pow(2).mean().sqrt().item<double>(); };
  const double plain = distance(train(at::kBFloat16, false)), kahan = distance(train(at::kBFloat16, true));
  std::cout << "RMS distance to the float32 run after 500 steps: bf16 " << plain << ", bf16 with Kahan " << kahan
            << " (float32 moved " << distance(start) << ")" << std::endl;
  EXPECT_GT(distance(start), 0.03) << "the float32 run should move the weights";
  EXPECT_LT(kahan * 10, plain);
}

// bf16 moments take beta1 = 0.9 at float precision, as torchdistx's Python update does (LibTorch's mul_(Scalar)
// would take bf16's 0.8984): two steps' first moment, rounded to bf16 after each op, worked out in float.
TEST(AnyPrecisionAdamW, Bf16MomentsTakeTheBetasAtFloatPrecision) {
  torch::manual_seed(2);
  at::Tensor w = torch::randn({10000}).requires_grad_();
  const at::Tensor g = torch::randn({10000});
  auto o = AnyPrecisionAdamWOptions(1e-3).momentum_dtype(at::kBFloat16).variance_dtype(at::kBFloat16);
  AnyPrecisionAdamW opt({w}, o);
  for (int step = 0; step < 2; ++step) {
    w.mutable_grad() = g;
    opt.step();
  }
  auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
  const at::Tensor beta1 = torch::full({}, 0.9f), alpha = torch::full({}, static_cast<float>(1 - 0.9));
  const at::Tensor m1 = bf16(alpha * g), m2 = bf16(bf16(m1 * beta1) + alpha * g);
  const auto& s = static_cast<AnyPrecisionAdamWParamState&>(*opt.state().at(w.unsafeGetTensorImpl()));
  EXPECT_TRUE(torch::equal(s.exp_avg().to(at::kFloat), m2))
      << (s.exp_avg().to(at::kFloat) != m2).to(at::kFloat).mean().item<double>() << " of the moments differ";
}

TEST(AnyPrecisionAdamW, BadOptionsAreNamed) {
  at::Tensor w = torch::zeros({3}, torch::requires_grad());
  testing::expect_error<std::invalid_argument>([&] { AnyPrecisionAdamW({w}, AnyPrecisionAdamWOptions(-1)); },
                                               {"lr -1"});
  testing::expect_error<std::invalid_argument>(
      [&] { AnyPrecisionAdamW({w}, AnyPrecisionAdamWOptions().betas({0.9, 1.0})); }, {"beta2 1"});
  testing::expect_error<std::invalid_argument>(
      [&] { AnyPrecisionAdamW({w}, AnyPrecisionAdamWOptions().momentum_dtype(at::kInt)); }, {"not a floating-point"});
}

TEST(Adafactor, BadOptionsAreNamed) {
  at::Tensor w = torch::zeros({3}, torch::requires_grad());
  testing::expect_error<std::invalid_argument>([&] { Adafactor({w}, AdafactorOptions().decay_rate(0.5)); },
                                               {"decay_rate 0.5", "negative"});
  testing::expect_error<std::invalid_argument>([&] { Adafactor({w}, AdafactorOptions().beta1(1)); }, {"beta1 1"});
  testing::expect_error<std::invalid_argument>(
      [&] { Adafactor({w}, AdafactorOptions().relative_step(false).warmup_init(true)); }, {"warmup_init needs"});
}

// What each parameter keeps: row and column statistics of (..., R, C) for two or more dimensions (how a checkpoint
// splits them: rows like the parameter's, a matrix's columns whole), a full second moment otherwise, a first moment
// only with beta1; the step moves every parameter against its gradient.
TEST(Adafactor, FactoredStateShapesAndSplits) {
  std::vector<at::Tensor> params = make_params(3);
  const std::vector<at::Tensor> before = {params[0].detach().clone(), params[3].detach().clone()};
  Adafactor optimizer(params, AdafactorOptions(1e-2).relative_step(false).beta1(0.9));
  (params[0].sum() + params[1].sum() + params[2] + params[3].sum()).backward();
  optimizer.step();
  auto tensors = [&](size_t i) {
    return state_tensors(*optimizer.state().at(params[i].unsafeGetTensorImpl()), params[i]);
  };
  const auto matrix = tensors(0), vector = tensors(1), cube = tensors(3);
  EXPECT_EQ(matrix.at("exp_avg_sq_row").tensor.sizes(), (std::vector<int64_t>{37}));
  EXPECT_EQ(matrix.at("exp_avg_sq_col").tensor.sizes(), (std::vector<int64_t>{11}));
  EXPECT_EQ(matrix.at("exp_avg_sq_row").split, StateSplit::BY_ROWS);
  EXPECT_EQ(matrix.at("exp_avg_sq_col").split, StateSplit::WHOLE);
  EXPECT_EQ(matrix.at("exp_avg").split, StateSplit::LIKE_PARAMETER);
  EXPECT_EQ(matrix.count("exp_avg_sq"), 0u);
  EXPECT_EQ(vector.at("exp_avg_sq").tensor.sizes(), (std::vector<int64_t>{1000}));
  EXPECT_EQ(vector.count("exp_avg_sq_row"), 0u);
  EXPECT_EQ(cube.at("exp_avg_sq_row").tensor.sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(cube.at("exp_avg_sq_col").tensor.sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(cube.at("exp_avg_sq_col").split, StateSplit::BY_ROWS);  // dim 0 is the parameter's
  EXPECT_TRUE((params[0] < before[0]).all().item<bool>());  // gradient 1 everywhere: every weight goes down
  EXPECT_TRUE((params[3] < before[1]).all().item<bool>());
  Adafactor none(params, AdafactorOptions(1e-2).relative_step(false));
  params[0].mutable_grad() = torch::ones_like(params[0]);
  none.step();
  EXPECT_EQ(state_tensors(*none.state().at(params[0].unsafeGetTensorImpl()), params[0]).count("exp_avg"), 0u);
}

}  // namespace
}  // namespace shardtrain::optim
