// replicate (DDP): training matches one process on the whole batch (SGD, AdamW; one bucket and many), parameters
// start equal to rank 0's, no_sync accumulates without communication, and a parameter without gradient is an
// error naming it. With activation checkpointing (every block, or the whole model) training is the same.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dist_test_env.h"
#include "shardtrain/ddp/replicate.h"
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

void expect_parity(bool adamw, double bucket_cap_mb, Checkpoint checkpoint = Checkpoint::NONE) {
  static const char* checkpoint_names[] = {"", " checkpointed blocks", " checkpointed model"};
  const std::string label = std::string(adamw ? "AdamW" : "SGD") + " bucket " + std::to_string(bucket_cap_mb) +
                            " MB" + checkpoint_names[static_cast<int>(checkpoint)] +
                            " W=" + std::to_string(test_process_group().world_size());
  auto batches = make_batches();
  torch::manual_seed(42);
  Toy ref;
  auto ref_opt = make_optimizer(adamw, ref->parameters());
  // Every rank but 0 starts from other weights: replicate() must hand out rank 0's.
  torch::manual_seed(test_process_group().rank() == 0 ? 42 : 1000 + test_process_group().rank());
  Toy model;
  if (checkpoint == Checkpoint::BLOCKS) {
    for (auto& b : model->blocks) nn::checkpoint_module(*b);
  }
  if (checkpoint == Checkpoint::WHOLE_MODEL) nn::checkpoint_module(*model);
  DdpOptions options;
  options.bucket_cap_mb = bucket_cap_mb;
  Ddp ddp = replicate(model.ptr(), test_process_group().world(), options);
  auto opt = make_optimizer(adamw, model->parameters());
  for (auto& [x, y] : batches) {
    ref_opt->zero_grad();
    at::Tensor ref_loss = torch::mse_loss(ref(x), y);
    ref_loss.backward();
    ref_opt->step();
    opt->zero_grad();
    torch::mse_loss(model(local_rows(x)), local_rows(y)).backward();
    opt->step();
  }
  expect_params_equal(parameters_of(*model), *ref, label);
  EXPECT_EQ(ddp.all_reduces(), static_cast<int64_t>(ddp.buckets().size() * batches.size())) << label;
}

TEST(Ddp, TrainsLikeOneProcess) {
  for (bool adamw : {false, true}) {
    expect_parity(adamw, 25.0);    // one bucket
    expect_parity(adamw, 0.0005);  // ~524 bytes: a bucket every parameter or two
    for (Checkpoint c : {Checkpoint::BLOCKS, Checkpoint::WHOLE_MODEL}) {
      expect_parity(adamw, 25.0, c);
      expect_parity(adamw, 0.0005, c);
    }
  }
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
  torch::manual_seed(42);
  Toy model;
  Ddp ddp = replicate(model.ptr(), test_process_group().world());
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  {
    NoSync no_sync(ddp);
    (torch::mse_loss(model(local_rows(batches[0].first)), local_rows(batches[0].second)) / 2).backward();
  }
  EXPECT_EQ(ddp.all_reduces(), 0);
  (torch::mse_loss(model(local_rows(batches[1].first)), local_rows(batches[1].second)) / 2).backward();
  EXPECT_EQ(ddp.all_reduces(), 1);
  sgd.step();
  expect_params_equal(parameters_of(*model), *ref, "no_sync");
}

TEST(Ddp, UnusedParameterIsAnErrorNamingIt) {
  Toy model;
  model->active_blocks = 2;  // blocks2 takes no part
  replicate(model.ptr(), test_process_group().world());
  auto [x, y] = make_batches().front();
  testing::expect_error<std::exception>([&] { torch::mse_loss(model(local_rows(x)), local_rows(y)).backward(); },
                                        {"parameter 'blocks2."});
  // With find_unused_parameters the same model trains; the unused parameters get zero gradients.
  Toy tolerant;
  tolerant->active_blocks = 2;
  DdpOptions options;
  options.find_unused_parameters = true;
  replicate(tolerant.ptr(), test_process_group().world(), options);
  torch::mse_loss(tolerant(local_rows(x)), local_rows(y)).backward();
  EXPECT_EQ(tolerant->blocks[2]->fc1->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_GT(tolerant->blocks[1]->fc1->weight.grad().abs().sum().item<double>(), 0.0);
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
