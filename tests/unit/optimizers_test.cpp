// The optimizers against LibTorch's AdamW, step after step, with weight decay groups and parameters without
// gradients: optim::FusedAdamW to float32 rounding (and its fallback to LibTorch's step, AMSGrad);
// optim::AnyPrecisionAdamW bitwise in float32 per operation (fused to rounding, and against its once-rounded
// definition in other dtypes), and with bf16 weights and states, Kahan summation keeping the
// weights near the float32 run where plain bf16 updates round away.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/optim/adafactor.h"
#include "shardtrain/optim/anyprecision_adamw.h"
#include "shardtrain/optim/optimizer_state.h"
#include "shardtrain/optim/fused_adamw.h"
#include "optim/anyprecision_foreach.h"
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

// The per-operation step is AdamW bitwise; the fused one (the default) to float32 rounding.
TEST(AnyPrecisionAdamW, InFloat32WithoutKahanIsAdamW) {
  std::unique_ptr<torch::optim::AdamW> ref_keep;
  auto [ref, ref_opt] = run(adamw(false), ref_keep);
  for (bool fused : {false, true}) {
    std::unique_ptr<AnyPrecisionAdamW> any_keep;
    auto options = AnyPrecisionAdamWOptions(3e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1).fused(fused);
    options.momentum_dtype(at::kFloat).variance_dtype(at::kFloat);
    auto [got, got_opt] = run(options, any_keep);
    auto same = [&](const at::Tensor& a, const at::Tensor& b, double atol) {
      return fused ? torch::allclose(a, b, 1e-5, atol) : torch::equal(a, b);
    };
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_TRUE(same(got[i], ref[i], 1e-6)) << "fused " << fused << ", parameter " << i << " differs by "
                                              << (got[i] - ref[i]).abs().max().item<double>();
      const auto& a =
          static_cast<torch::optim::AdamWParamState&>(*ref_opt->state().at(ref[i].unsafeGetTensorImpl()));
      const auto& b = static_cast<AnyPrecisionAdamWParamState&>(*got_opt->state().at(got[i].unsafeGetTensorImpl()));
      EXPECT_EQ(a.step(), b.step());
      EXPECT_TRUE(same(a.exp_avg(), b.exp_avg(), 1e-7) && same(a.exp_avg_sq(), b.exp_avg_sq(), 1e-9))
          << "fused " << fused << ", parameter " << i;
      EXPECT_FALSE(b.compensation().defined());
    }
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
  auto train = [&](at::ScalarType dtype, bool kahan, bool fused) {
    at::Tensor w = start.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
    auto o = AnyPrecisionAdamWOptions(2e-4).use_kahan_summation(kahan).fused(fused);
    o.momentum_dtype(dtype).variance_dtype(dtype).compensation_buffer_dtype(dtype);
    AnyPrecisionAdamW opt({w}, o);
    for (const at::Tensor& g : grads) {
      w.mutable_grad() = g.to(dtype);
      opt.step();
    }
    return w.detach().to(at::kFloat);
  };
  const at::Tensor reference = train(at::kFloat, false, false);
  auto distance = [&](const at::Tensor& w) { return (w - reference).pow(2).mean().sqrt().item<double>(); };
  EXPECT_GT(distance(start), 0.03) << "the float32 run should move the weights";
  for (bool fused : {false, true}) {
    const double plain = distance(train(at::kBFloat16, false, fused));
    const double kahan = distance(train(at::kBFloat16, true, fused));
    std::cout << (fused ? "fused" : "per operation") << ": RMS distance to the float32 run after 500 steps: bf16 "
              << plain << ", bf16 with Kahan " << kahan << " (float32 moved " << distance(start) << ")" << std::endl;
    EXPECT_LT(kahan * 10, plain) << "fused " << fused;
  }
}

// bf16 moments take beta1 = 0.9 at float precision, as torchdistx's Python update does (LibTorch's mul_(Scalar)
// would take bf16's 0.8984): two steps' first moment, rounded to bf16 after each op, worked out in float.
TEST(AnyPrecisionAdamW, Bf16MomentsTakeTheBetasAtFloatPrecision) {
  torch::manual_seed(2);
  at::Tensor w = torch::randn({10000}).requires_grad_();
  const at::Tensor g = torch::randn({10000});
  auto o = AnyPrecisionAdamWOptions(1e-3).momentum_dtype(at::kBFloat16).variance_dtype(at::kBFloat16).fused(false);
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

// The fused step against its definition worked out in float64: LibTorch AdamW's operations, each tensor rounded to
// its dtype once per step when stored, and with Kahan summation the compensation keeping what rounding the
// parameter dropped. Float32 arithmetic makes the kernel land on the other side of a rounding boundary now and then
// (one bf16 spacing); the per-operation step, rounding after every operation, differs from the definition far
// more often.
TEST(AnyPrecisionAdamW, FusedStepRoundsEachTensorOnce) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
  struct Case {
    at::ScalarType param, moments, compensation;
    bool kahan;
  };
  for (const Case& k : {Case{at::kBFloat16, at::kBFloat16, at::kBFloat16, true},
                        Case{at::kBFloat16, at::kFloat, at::kFloat, true},
                        Case{at::kFloat, at::kBFloat16, at::kBFloat16, true},
                        Case{at::kBFloat16, at::kBFloat16, at::kBFloat16, false}}) {
    torch::manual_seed(3);
    const int64_t n = 300001;  // several threads' ranges and a partial chunk
    const at::Tensor start = torch::randn({n}) * 0.3, grads = torch::randn({4, n});
    auto train = [&](bool fused) {
      at::Tensor w = start.to(k.param, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
      auto o = AnyPrecisionAdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd).fused(fused);
      o.momentum_dtype(k.moments).variance_dtype(k.moments).compensation_buffer_dtype(k.compensation);
      AnyPrecisionAdamW opt({w}, o.use_kahan_summation(k.kahan));
      for (int64_t step = 0; step < grads.size(0); ++step) {
        w.mutable_grad() = grads[step].to(k.param);
        opt.step();
      }
      const auto& s = static_cast<AnyPrecisionAdamWParamState&>(*opt.state().at(w.unsafeGetTensorImpl()));
      return std::vector<at::Tensor>{w.detach().to(at::kDouble), s.exp_avg().to(at::kDouble),
                                     s.exp_avg_sq().to(at::kDouble)};
    };
    // The definition in float64, rounding where the fused step stores.
    auto round = [](const at::Tensor& t, at::ScalarType dtype) { return t.to(dtype).to(at::kDouble); };
    at::Tensor p = round(start, k.param), m = torch::zeros({n}, at::kDouble), v = m.clone(), c = m.clone();
    for (int64_t step = 1; step <= grads.size(0); ++step) {
      const at::Tensor g = round(grads[step - 1], k.param);
      const at::Tensor m1 = m * b1 + (1 - b1) * g, v1 = v * b2 + (1 - b2) * g * g;
      const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
      const at::Tensor update = -(lr / bc1) * m1 / (v1.sqrt() / std::sqrt(bc2) + eps), decayed = p * (1 - lr * wd);
      if (k.kahan) {
        const at::Tensor c1 = c + update, moved = round(decayed + c1, k.param);
        c = round(c1 + (decayed - moved), k.compensation);
        p = moved;
      } else {
        p = round(decayed + update, k.param);
      }
      m = round(m1, k.moments);
      v = round(v1, k.moments);
    }
    const std::vector<at::Tensor> want{p, m, v}, fused = train(true), per_op = train(false);
    const char* names[] = {"parameter", "exp_avg", "exp_avg_sq"};
    // Where the fused step may stand from the definition: one spacing of the stored dtype (bf16: 2^-7 relative
    // at most; float32's, with float32 arithmetic), twice over because a moment one spacing off is carried into
    // the next step by beta. Below that, at the scale of the terms summed, where cancellation leaves their
    // rounding: (1 - beta1) g for the first moment, and for the parameter the updates, each lr at most, through
    // moments a spacing apart.
    auto spacing = [](at::ScalarType t) { return t == at::kBFloat16 ? 1.0 / 128 : 1e-6; };
    const double steps = static_cast<double>(grads.size(0));
    const double floors[] = {lr * steps * spacing(k.moments) / spacing(k.param), 1 - b1, 0};
    for (size_t i = 0; i < want.size(); ++i) {
      const at::ScalarType stored = i == 0 ? k.param : k.moments;
      const bool bf16 = stored == at::kBFloat16;
      const at::Tensor tolerance = (want[i].abs() + floors[i]) * 2 * spacing(stored) + 1e-30;
      const double fused_worst = ((fused[i] - want[i]).abs() / tolerance).max().item<double>();
      const double fused_off = (fused[i] != want[i]).to(at::kDouble).mean().item<double>();
      const double per_op_off = (per_op[i] != want[i]).to(at::kDouble).mean().item<double>();
      std::cout << names[i] << " (param " << c10::toString(k.param) << ", state " << c10::toString(k.moments)
                << (k.kahan ? ", Kahan" : "") << "): fused differs from the definition in " << fused_off
                << " of the elements (at most " << fused_worst << " spacing), per operation in " << per_op_off
                << std::endl;
      EXPECT_LE(fused_worst, 1.0) << names[i];
      if (bf16) {
        EXPECT_LT(fused_off, 0.02) << names[i];
        EXPECT_LT(fused_off * 10, per_op_off) << names[i];
      }
    }
  }
}

// What the kernel does not take — float16, a non-contiguous parameter — takes the per-operation step, exactly.
TEST(AnyPrecisionAdamW, FusedFallsBackToOperationsForWhatItDoesNotTake) {
  for (int kind = 0; kind < 2; ++kind) {
    auto train = [&](bool fused) {
      torch::manual_seed(4);
      at::Tensor w = kind == 0 ? torch::randn({300}).to(at::kHalf) : torch::randn({20, 15}).t();
      w = w.detach().requires_grad_();
      auto o = AnyPrecisionAdamWOptions(1e-2).weight_decay(0.1).use_kahan_summation(true).fused(fused);
      AnyPrecisionAdamW opt({w}, o);
      for (int step = 0; step < 3; ++step) {
        w.mutable_grad() = torch::randn(w.sizes()).to(w.scalar_type());
        opt.step();
      }
      return w.detach().clone();
    };
    EXPECT_TRUE(torch::equal(train(true), train(false))) << (kind == 0 ? "float16" : "non-contiguous");
  }
}

// The multi-tensor step GPU parameters take (anyprecision_foreach.h), run here on CPU tensors in float32, where
// LibTorch's scalars keep their precision: bitwise the per-operation step, over one call mixing decayed and
// undecayed tensors, with and without Kahan, a non-contiguous one, and a tensor that skipped a step (its bias
// correction differs from the others').
TEST(AnyPrecisionAdamW, MultiTensorStepIsThePerOperationStep) {
  const double lr = 1e-2, beta1 = 0.8, beta2 = 0.95, eps = 1e-6, wd = 0.1;
  auto make = [] {
    torch::manual_seed(4);
    std::vector<at::Tensor> w = {torch::randn({300}), torch::randn({20, 15}).t(), torch::randn({7, 3}),
                                 torch::randn({40})};
    for (at::Tensor& t : w) t = t.detach().requires_grad_();
    return w;
  };
  const bool kahan[] = {true, true, false, false};
  const bool decayed[] = {true, false, true, false};
  auto grad = [](int step, size_t i, const at::Tensor& w) {
    return step == 1 && i == 2 ? at::Tensor() : torch::randn(w.sizes());
  };
  auto options = [&](size_t i) {
    return AnyPrecisionAdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(decayed[i] ? wd : 0)
        .use_kahan_summation(kahan[i]).momentum_dtype(at::kFloat).variance_dtype(at::kFloat)
        .compensation_buffer_dtype(at::kFloat).fused(false);
  };

  std::vector<at::Tensor> ref = make();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t i = 0; i < ref.size(); ++i) {
    groups.emplace_back(std::vector<at::Tensor>{ref[i]}, std::make_unique<AnyPrecisionAdamWOptions>(options(i)));
  }
  AnyPrecisionAdamW opt(groups, options(0));
  torch::manual_seed(11);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < ref.size(); ++i) ref[i].mutable_grad() = grad(step, i, ref[i]);
    opt.step();
  }

  std::vector<at::Tensor> got = make();
  std::vector<AnyPrecisionTensors> lists(got.size());
  std::vector<int64_t> steps(got.size(), 0);
  for (size_t i = 0; i < got.size(); ++i) {
    lists[i].param = got[i];
    lists[i].exp_avg = at::zeros_like(got[i], at::MemoryFormat::Contiguous);
    lists[i].exp_avg_sq = at::zeros_like(got[i], at::MemoryFormat::Contiguous);
    if (kahan[i]) lists[i].compensation = at::zeros_like(got[i]);
  }
  torch::manual_seed(11);
  for (int step = 0; step < 4; ++step) {
    std::vector<AnyPrecisionTensors> now;
    for (size_t i = 0; i < got.size(); ++i) {
      lists[i].grad = grad(step, i, got[i]);
      if (!lists[i].grad.defined()) continue;
      const double t = static_cast<double>(++steps[i]);
      AdamWStepScalars& s = lists[i].scalars;
      s.decay = 1 - lr * (decayed[i] ? wd : 0);
      s.beta1 = beta1;
      s.beta2 = beta2;
      s.sqrt_bias_correction2 = std::sqrt(1 - std::pow(beta2, t));
      s.eps = eps;
      s.step_size = lr / (1 - std::pow(beta1, t));
      now.push_back(lists[i]);
    }
    at::NoGradGuard no_grad;
    foreach_anyprecision_step(now);
  }

  for (size_t i = 0; i < got.size(); ++i) {
    const auto& s = static_cast<AnyPrecisionAdamWParamState&>(*opt.state().at(ref[i].unsafeGetTensorImpl()));
    EXPECT_EQ(s.step(), steps[i]) << "tensor " << i;
    EXPECT_TRUE(torch::equal(got[i], ref[i])) << "tensor " << i << " differs by " << (got[i] - ref[i]).abs().max();
    EXPECT_TRUE(torch::equal(lists[i].exp_avg, s.exp_avg())) << "exp_avg of tensor " << i;
    EXPECT_TRUE(torch::equal(lists[i].exp_avg_sq, s.exp_avg_sq())) << "exp_avg_sq of tensor " << i;
    if (kahan[i]) EXPECT_TRUE(torch::equal(lists[i].compensation, s.compensation())) << "compensation " << i;
  }

  // The optimizer sends no CPU tensor there (ATen's CPU list operations would round its scalars).
  EXPECT_FALSE(foreach_anyprecision_takes(got[0], got[0].grad(), lists[0].exp_avg, lists[0].exp_avg_sq,
                                          lists[0].compensation));
  std::vector<AnyPrecisionTensors> two_groups = {lists[0], lists[1]};
  two_groups[1].scalars.beta1 = 0.9;
  testing::expect_error<std::invalid_argument>([&] { foreach_anyprecision_step(two_groups); },
                                               {"betas (0.900000, 0.950000)", "expected one group"});
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
