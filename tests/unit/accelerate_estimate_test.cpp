// Accelerate's arithmetic and formatting in plan/accelerate_estimate.h, on hand-made layouts; the whole table
// against Accelerate itself is tests/reference/estimate_memory_check.py.
#include <gtest/gtest.h>

#include "shardtrain/models/zoo.h"
#include "shardtrain/plan/accelerate_estimate.h"
#include "support/expect_error.h"

namespace shardtrain::plan {
namespace {

TEST(AccelerateEstimate, BytesPrintLikeConvertBytes) {
  EXPECT_EQ(accelerate_bytes(512, true), "512 bytes");
  EXPECT_EQ(accelerate_bytes(512.5), "512.5 bytes");
  EXPECT_EQ(accelerate_bytes(1024, true), "1.0 KB");
  EXPECT_EQ(accelerate_bytes(433249280, true), "413.18 MB");
  EXPECT_EQ(accelerate_bytes(433249280.0 * 4, true), "1.61 GB");
  EXPECT_EQ(accelerate_bytes(1024.0 * 1024 * 1024 * 1024 * 1024 * 2048), "2048.0 PB");
  EXPECT_EQ(accelerate_bytes(1045000), "1020.51 KB");
}

// The tree comes from the names; a module kept whole counts with everything below it; a module split open drops
// the tensors it holds itself (Accelerate's get_max_layer_size looks at children only).
TEST(AccelerateEstimate, LargestLayerFollowsNoSplitAndChildren) {
  models::HfModelLayout layout;
  layout.tensors = {{"scale", {}, at::kFloat},
                    {"emb.weight", {100, 4}, at::kFloat},                // 1600 B: a leaf module
                    {"enc.layer.0.a.weight", {10, 10}, at::kFloat},      // 400
                    {"enc.layer.0.b.weight", {10, 10}, at::kFloat},      // 400: layer 0 = 800 kept whole
                    {"enc.layer.1.a.weight", {10, 10}, at::kFloat},
                    {"enc.layer.1.b.weight", {10, 10}, at::kFloat},
                    {"vis.cls", {3000}, at::kFloat},                     // 12000 B on a split module: dropped
                    {"vis.proj.weight", {5, 5}, at::kFloat},
                    {"emb.ids", {1, 64}, at::kLong, true}};              // 512 B buffer
  layout.no_split = {"^enc\\.layer\\.\\d+$"};
  ModelSizes s = accelerate_sizes(layout);
  EXPECT_EQ(s.total_bytes, 4 + 1600 + 4 * 400 + 12000 + 100 + 512);
  EXPECT_EQ(s.largest_layer_bytes, 1600 + 512);
  EXPECT_EQ(s.largest_layers, std::vector<std::string>{"emb"});

  layout.no_split = {};  // every module split down to its leaves: the layers' 400 B matrices
  layout.tensors[1].shape = {1, 1};
  layout.tensors.pop_back();
  s = accelerate_sizes(layout);
  EXPECT_EQ(s.largest_layer_bytes, 400);
  EXPECT_EQ(s.largest_layers.size(), 4u);
}

TEST(AccelerateEstimate, TrainingUsageIsAcceleratesStages) {
  const auto f32 = accelerate_training_usage(1000, "float32");
  ASSERT_TRUE(f32);
  EXPECT_EQ(f32->gradients, 1000);
  EXPECT_EQ(f32->optimizer, 2000);
  EXPECT_EQ(f32->highest(), 4000);
  const auto bf16 = accelerate_training_usage(1001, "bfloat16");
  ASSERT_TRUE(bf16);
  EXPECT_EQ(bf16->gradients, 1001 + 500);
  EXPECT_EQ(bf16->highest(), 2002);
  EXPECT_FALSE(accelerate_training_usage(1000, "int4"));
  testing::expect_error<std::invalid_argument>([] { accelerate_training_usage(1000, "fp64"); }, {"'fp64'", "int4"});
}

// The seed's table (Accelerate's documentation for bert-base-cased), from the zoo flavor.
TEST(AccelerateEstimate, BertBaseCasedGivesTheSeedsNumbers) {
  const ModelSizes s = accelerate_sizes(models::recipe_of("bert-base-cased")->hf_base_model());
  EXPECT_EQ(accelerate_bytes(static_cast<double>(s.total_bytes), true), "413.18 MB");
  const std::string table = adam_stages_table("bert-base-cased", s, {"float32", "float16"});
  for (const char* n : {"413.18 MB", "826.36 MB", "1.61 GB", "619.77 MB"}) {
    EXPECT_NE(table.find(n), std::string::npos) << n << " in\n" << table;
  }
}

}  // namespace
}  // namespace shardtrain::plan
