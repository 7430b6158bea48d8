// replicate (DDP): training matches one process on the whole batch (SGD, AdamW; one bucket and many; gradients as
// bucket views or not), parameters start equal to rank 0's, no_sync accumulates without communication, and a
// parameter without gradient is an error naming it. With activation checkpointing (every block, or the whole
// model) training is the same. Gradients as bucket views hold one gradient-sized buffer less during backward, and
// two buckets at most are in flight.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_env.h"
#include "shardtrain/ddp/replicate.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "parity_helpers.h"
#include "support/expect_error.h"

namespace shardtrain::ddp {
namespace {

using testing::expect_params_equal;
using testing::local_rows;
using testing::parameters_of;
using testing::test_process_group;
using namespace fsdp::testing_models;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(bool adamw, std::vector<at::Tensor> params) {
  if (!adamw) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
}

enum class Checkpoint { NONE, BLOCKS, WHOLE_MODEL };

void expect_parity(bool adamw, double bucket_cap_mb, Checkpoint checkpoint = Checkpoint::NONE,
                   bool bucket_view = false) {
  static const char* checkpoint_names[] = {"", " checkpointed blocks", " checkpointed model"};
  const std::string label = std::string(adamw ? "AdamW" : "SGD") + " bucket " + std::to_string(bucket_cap_mb) +
                            " MB" + checkpoint_names[static_cast<int>(checkpoint)] +
                            (bucket_view ? " gradient_as_bucket_view" : "") +
                            " W=" + std::to_string(test_process_group().world_size());
  auto batches = make_batches();
  torch::manual_seed(42);
  Toy ref;
  auto ref_opt = make_optimizer(adamw, ref->parameters());
  // Every rank but 0 starts from other weights: replicate() must hand out rank 0's.
  torch::manual_seed(test_process_group().rank() == 0 ? 42 : 1000 + test_process_group().rank());
  Toy model;
  if (checkpoint == Checkpoint::BLOCKS) {
    for (auto& b : model->blocks) nn::apply_activation_checkpoint(*b);
  }
  if (checkpoint == Checkpoint::WHOLE_MODEL) nn::apply_activation_checkpoint(*model);
  DdpOptions options;
  options.bucket_cap_mb = bucket_cap_mb;
  options.gradient_as_bucket_view = bucket_view;
  Ddp ddp = replicate(model.ptr(), test_process_group().world(), options);
  auto opt = make_optimizer(adamw, model->parameters());
  for (size_t step = 0; step < batches.size(); ++step) {
    auto& [x, y] = batches[step];
    ref_opt->zero_grad();
    at::Tensor ref_loss = torch::mse_loss(ref(x), y);
    ref_loss.backward();
    ref_opt->step();
    // Gradients set to none (then copied into the bucket once) and zeroed in place (already the bucket), in turn.
    opt->zero_grad(/*set_to_none=*/step % 2 == 0);
    torch::mse_loss(model(local_rows(x)), local_rows(y)).backward();
    opt->step();
  }
  expect_params_equal(parameters_of(*model), *ref, label);
  // A group of one reduces nothing and allocates no bucket: its gradients are their own mean.
  const bool alone = test_process_group().world().size() == 1;
  if (bucket_view && bucket_cap_mb >= 25.0 && !alone) {  // one bucket: every gradient lies in one buffer
    const auto params = model->parameters();
    EXPECT_EQ(params.front().grad().storage().data(), params.back().grad().storage().data()) << label;
  }
  EXPECT_EQ(ddp.all_reduces(), alone ? 0 : static_cast<int64_t>(ddp.buckets().size() * batches.size())) << label;
}

TEST(Ddp, TrainsLikeOneProcess) {
  for (bool adamw : {false, true}) {
    for (bool bucket_view : {false, true}) {
      expect_parity(adamw, 25.0, Checkpoint::NONE, bucket_view);    // one bucket
      expect_parity(adamw, 0.0005, Checkpoint::NONE, bucket_view);  // ~524 bytes: a bucket every parameter or two
      for (Checkpoint c : {Checkpoint::BLOCKS, Checkpoint::WHOLE_MODEL}) {
        expect_parity(adamw, 25.0, c, bucket_view);
        expect_parity(adamw, 0.0005, c, bucket_view);
      }
    }
  }
}

TEST(Ddp, GradientAsBucketViewHoldsOneGradientCopyLess) {
  // Bytes above what was live before the model was built, at the peak of the second step's backward (the first
  // creates SGD's momentum-free state and, with views, points the gradients at the buckets). Without views: the
  // parameters, AccumulateGrad's gradients and the per-backward buckets (3P). With views: the parameters and the
  // persistent buckets, plus one parameter's gradient copied in at a time (2P + the largest parameter, P/8 here).
  memory::install_cpu_memory_counter();
  const double param_bytes = 4.0 * 4 * (256 * 64 + 256 + 64 * 256 + 64);
  auto backward_peak = [&](bool bucket_view) {
    const int64_t base = memory::cpu_memory_stats().current_bytes;
    torch::manual_seed(1);
    auto model = std::make_shared<fsdp::testing_models::WideImpl>();
    DdpOptions options;
    options.gradient_as_bucket_view = bucket_view;
    Ddp ddp = replicate(model, test_process_group().world(), options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    const at::Tensor x = torch::randn({8, 64});
    int64_t peak = 0;
    for (int step = 0; step < 2; ++step) {
      sgd.zero_grad();
      at::Tensor loss = torch::mse_loss(model->forward(x), torch::zeros({8, 64}));
      memory::reset_cpu_peak();
      loss.backward();
      peak = memory::cpu_memory_stats().peak_bytes - base;
      sgd.step();
    }
    return static_cast<double>(peak) / param_bytes;
  };
  const double copies = backward_peak(false), views = backward_peak(true);
  if (test_process_group().world().size() == 1) {
    // Alone, neither copies gradients into buckets: the parameters and their gradients (2P).
    EXPECT_LT(copies, 2.3) << "peak during backward in units of the parameters' bytes";
    EXPECT_LT(views, 2.3) << "peak during backward in units of the parameters' bytes";
  } else {
    EXPECT_LE(views, copies - 0.7) << "peak during backward in units of the parameters' bytes";
  }
  std::cout << "backward peak / parameter bytes: copies " << copies << ", bucket views " << views << std::endl;
}

// Two bucket all-reduces in flight at most: an earlier bucket is waited for, its mean written back and its flat
// copy dropped when a third starts. Eight equal layers, a bucket each: at the peak of backward the parameters,
// their gradients and two buckets (2P + P/4), where holding every bucket to the end of backward was 3P.
TEST(Ddp, AtMostTwoBucketsInFlight) {
  memory::install_cpu_memory_counter();
  const int64_t dim = 128, layers = 8;
  const double param_bytes = 4.0 * layers * dim * dim;
  const int64_t base = memory::cpu_memory_stats().current_bytes;
  torch::manual_seed(1);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
  }
  DdpOptions options;
  options.bucket_cap_mb = 4.0 * dim * dim / (1024 * 1024);  // one layer's weight
  Ddp ddp = replicate(model.ptr(), test_process_group().world(), options);
  const at::Tensor x = torch::randn({4, dim});
  int64_t peak = 0;
  for (int step = 0; step < 2; ++step) {
    model->zero_grad();
    at::Tensor loss = model->forward(x).pow(2).mean();
    memory::reset_cpu_peak();
    loss.backward();
    peak = memory::cpu_memory_stats().peak_bytes - base;
  }
  const bool alone = test_process_group().world().size() == 1;
  EXPECT_EQ(ddp.buckets().size(), static_cast<size_t>(layers));
  // Activations (4 x 128 floats a layer) are small beside P/8.
  EXPECT_LT(static_cast<double>(peak) / param_bytes, alone ? 2.1 : 2.4)
      << "peak during backward in units of the parameters' bytes";
}

TEST(Ddp, BucketsFollowReverseParameterOrderUpToTheCap) {
  Toy model;
  DdpOptions options;
  options.bucket_cap_mb = 1000.0 / (1024 * 1024);  // 1000 bytes
  Ddp ddp = replicate(model.ptr(), test_process_group().world(), options);
  auto buckets = ddp.buckets();
  ASSERT_GT(buckets.size(), 3u);
  EXPECT_EQ(buckets.front().front(), "head.bias");  // backward produces the last parameters first
  EXPECT_EQ(buckets.back().back(), "in.weight");
  EXPECT_EQ(Ddp(replicate(Toy().ptr(), test_process_group().world())).buckets().size(), 1u);
}

TEST(Ddp, NoSyncAccumulatesThenAveragesTheSum) {
  auto batches = make_batches();
  Toy ref = testing::accumulated_reference();
  for (bool bucket_view : {false, true}) {
    torch::manual_seed(42);
    Toy model;
    DdpOptions options;
    options.gradient_as_bucket_view = bucket_view;
    Ddp ddp = replicate(model.ptr(), test_process_group().world(), options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    {
      NoSync no_sync(ddp);
      (torch::mse_loss(model(local_rows(batches[0].first)), local_rows(batches[0].second)) / 2).backward();
    }
    EXPECT_EQ(ddp.all_reduces(), 0);
    (torch::mse_loss(model(local_rows(batches[1].first)), local_rows(batches[1].second)) / 2).backward();
    EXPECT_EQ(ddp.all_reduces(), test_process_group().world().size() > 1 ? 1 : 0);
    sgd.step();
    expect_params_equal(parameters_of(*model), *ref, bucket_view ? "no_sync gradient_as_bucket_view" : "no_sync");
  }
}

TEST(Ddp, UnusedParameterIsAnErrorNamingIt) {
  Toy model;
  model->active_blocks = 2;  // blocks2 takes no part
  replicate(model.ptr(), test_process_group().world());
  const auto batch = make_batches().front();
  const torch::Tensor& x = batch.first;
  const torch::Tensor& y = batch.second;
  testing::expect_error<std::exception>([&] { torch::mse_loss(model(local_rows(x)), local_rows(y)).backward(); },
                                        {"parameter 'blocks2."});
  // With find_unused_parameters the same model trains. A block no rank uses keeps no gradient (as PyTorch's DDP
  // leaves it: optimizers skip it); one only rank 0 uses gets the mean over the ranks, equal everywhere. One bucket,
  // or a bucket every parameter or two (those of the unused blocks start and complete at the end of backward,
  // beyond the two in flight).
  const dist::Communicator& world = test_process_group().world();
  for (const auto& [bucket_view, bucket_cap_mb] : {std::pair{false, 25.0}, std::pair{true, 25.0},
                                                   std::pair{false, 0.0005}, std::pair{true, 0.0005}}) {
    SCOPED_TRACE(std::string(bucket_view ? "bucket views, " : "") + std::to_string(bucket_cap_mb) + " MB buckets");
    Toy tolerant;
    tolerant->active_blocks = 1;
    DdpOptions options;
    options.find_unused_parameters = true;
    options.gradient_as_bucket_view = bucket_view;
    options.bucket_cap_mb = bucket_cap_mb;
    replicate(tolerant.ptr(), world, options);
    for (int step = 0; step < 2; ++step) {  // the second: the bucket holds the first step's values
      tolerant->active_blocks = world.rank() == 0 ? 2 : 1;
      for (auto& p : tolerant->parameters()) p.mutable_grad() = at::Tensor();
      torch::mse_loss(tolerant(local_rows(x)), local_rows(y)).backward();
      EXPECT_FALSE(tolerant->blocks[2]->fc1->weight.grad().defined()) << "no rank used blocks2";
      const at::Tensor& rank0_only = tolerant->blocks[1]->fc1->weight.grad();
      ASSERT_TRUE(rank0_only.defined());
      EXPECT_GT(rank0_only.abs().sum().item<double>(), 0.0);
      at::Tensor top = rank0_only.clone(), bottom = rank0_only.clone();
      world.all_reduce(top, dist::ReduceOp::MAX).wait();
      world.all_reduce(bottom, dist::ReduceOp::SUM).wait();
      EXPECT_TRUE(torch::allclose(top * world.size(), bottom)) << "the same mean on every rank";
      EXPECT_GT(tolerant->blocks[0]->fc1->weight.grad().abs().sum().item<double>(), 0.0);
    }
  }
}

TEST(Ddp, BuffersFollowRankZero) {
  Toy model;
  model->offset.fill_(static_cast<double>(test_process_group().rank()));
  replicate(model.ptr(), test_process_group().world());
  EXPECT_EQ(model->offset.sum().item<double>(), 0.0);
  model->offset.fill_(static_cast<double>(test_process_group().rank() + 5));  // drifts on each rank
  torch::NoGradGuard no_grad;
  model(make_batches().front().first);  // the forward's broadcast brings rank 0's back
  EXPECT_EQ(model->offset.sum().item<double>(), 5.0 * kOut);
}

}  // namespace
}  // namespace shardtrain::ddp
