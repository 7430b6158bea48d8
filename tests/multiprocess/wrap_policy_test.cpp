// Wrap policies choose the units (by class name, type, size, predicate; the root takes the rest), and optimizer
// parameter groups chosen by name work on the shards: training with the transformer-layer policy and AdamW with
// no weight decay on biases and norms matches single-process training with the same groups.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_env.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/optim/param_groups.h"
#include "parity_helpers.h"
#include "support/expect_error.h"

namespace shardtrain::fsdp {
namespace {

using testing::test_process_group;
using namespace testing_models;

size_t unit_count(const WrapPolicy& policy) {
  Toy model;
  return fully_shard_model(model.ptr(), test_process_group().world(), policy).size();
}

TEST(WrapPolicy, SelectsUnitsAndTheRootTakesTheRest) {
  Toy model;
  auto units = fully_shard_model(model.ptr(), test_process_group().world(), wrap_by_class_name({"Block"}));
  ASSERT_EQ(units.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(units[i].parameter_names().size(), 6u);  // norm, fc1, fc2: weight + bias
  EXPECT_EQ(units[3].parameter_names(), (std::vector<std::string>{"in.weight", "in.bias", "head.weight", "head.bias"}));
  EXPECT_EQ(unit_count(wrap_by_class_name({"BlockImpl"})), 4u);
  EXPECT_EQ(unit_count(wrap_by_type<BlockImpl>()), 4u);
  // A block holds 20 + 286 + 270 = 576 parameters; Linear and LayerNorm cannot be units and are passed over.
  EXPECT_EQ(unit_count(wrap_by_size(576)), 4u);
  EXPECT_EQ(unit_count(wrap_by_size(577)), 1u);
  EXPECT_EQ(unit_count(wrap_if([](const std::string& name, torch::nn::Module&) { return name == "blocks1"; })), 2u);
  EXPECT_EQ(unit_count(any_of({wrap_if([](const std::string& n, torch::nn::Module&) { return n == "blocks0"; }),
                               wrap_if([](const std::string& n, torch::nn::Module&) { return n == "blocks2"; })})),
            3u);
}

TEST(WrapPolicy, ErrorsNameTheClassAndTheModule) {
  auto shard_by_class = [](const std::string& class_name) {
    Toy model;
    fully_shard_model(model.ptr(), test_process_group().world(), wrap_by_class_name({class_name}));
  };
  testing::expect_error<std::invalid_argument>([&] { shard_by_class("FLAVATransformerLayer"); },
                                               {"no module of class 'FLAVATransformerLayer'"});
  testing::expect_error<std::invalid_argument>([&] { shard_by_class("Linear"); }, {"'in'", "Interceptable"});
}

std::unique_ptr<torch::optim::AdamW> grouped_adamw(const torch::nn::Module& model) {
  std::vector<optim::NamedGroup> rules;
  rules.push_back({optim::no_weight_decay,
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0))});
  return std::make_unique<torch::optim::AdamW>(optim::param_groups_by_name(model, std::move(rules)),
                                               torch::optim::AdamWOptions(1e-2).weight_decay(0.5));
}

TEST(WrapPolicy, TransformerPolicyAndNamedGroupsTrainLikeOneProcess) {
  const int w = test_process_group().world_size();
  auto batches = make_batches();
  torch::manual_seed(42);
  Toy ref;
  auto ref_opt = grouped_adamw(*ref);
  ASSERT_EQ(ref_opt->param_groups().size(), 2u);
  EXPECT_EQ(ref_opt->param_groups()[0].params().size(), 14u);  // per block norm.{weight,bias}, fc{1,2}.bias; 2 root biases
  torch::manual_seed(42);
  Toy model;
  fully_shard_model(model.ptr(), test_process_group().world(), wrap_by_class_name({"Block"}));
  auto opt = grouped_adamw(*model);
  for (auto& [x, y] : batches) {
    ref_opt->zero_grad();
    torch::mse_loss(ref(x), y).backward();
    ref_opt->step();
    opt->zero_grad();
    torch::mse_loss(model(testing::local_rows(x)), testing::local_rows(y)).backward();
    opt->step();
  }
  testing::expect_params_equal(gather_full_parameters(model.ptr()), *ref, "W=" + std::to_string(w));
}

}  // namespace
}  // namespace shardtrain::fsdp
