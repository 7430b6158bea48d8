// AdamW with its moments on disk (optim/disk_adamw.h): the same parameters and moments as FusedAdamW bit for bit,
// over two groups of different options, float32 and bf16, parameters larger than a chunk and chunks of many, steps
// where some parameters have no gradient; a state read out and installed in another optimizer (a checkpoint's round
// trip through optim/optimizer_state.h) continues as the first; host memory holds two chunks' buffers; bad input
// named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/optim/disk_adamw.h"
#include "shardtrain/optim/fused_adamw.h"
#include "shardtrain/optim/optimizer_state.h"
#include "support/expect_error.h"
#include "support/scratch.h"

namespace shardtrain::optim {
namespace {

// Parameters of odd sizes (a 300 x 70 float32 matrix is 82 KiB, over the 32 KiB chunks), one in bf16.
std::vector<at::Tensor> make_params() {
  torch::manual_seed(1);
  std::vector<at::Tensor> p = {torch::randn({300, 70}), torch::randn({17}), torch::randn({40, 33}),
                               torch::randn({5, 5}).to(at::kBFloat16), torch::randn({1000})};
  for (auto& t : p) t.requires_grad_(true);
  return p;
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::vector<at::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(std::vector<at::Tensor>{p[0], p[1], p[2]},
                 std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
  g.emplace_back(std::vector<at::Tensor>{p[3], p[4]},
                 std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(0)));
  return g;
}

// Gradients for step `s`: the same on both sides; at step 1 the third parameter has none (a gap in the chunks).
void set_grads(std::vector<at::Tensor>& p, int s) {
  torch::manual_seed(100 + s);
  for (size_t i = 0; i < p.size(); ++i) {
    at::Tensor g = torch::randn(p[i].sizes()).to(p[i].scalar_type());
    p[i].mutable_grad() = (s == 1 && i == 2) ? at::Tensor() : g;
  }
}

DiskStateOptions disk_options(const std::string& dir) { return {dir, "optimizer-test", 32 << 10}; }

TEST(DiskAdamW, MatchesFusedAdamWBitForBit) {
  testing::TempDir dir("disk_adamw_");
  auto a = make_params(), b = make_params();
  FusedAdamW fused(groups_of(a), torch::optim::AdamWOptions());
  DiskAdamW disk(groups_of(b), torch::optim::AdamWOptions(), disk_options(dir.path));
  EXPECT_EQ(disk.disk_bytes() % 4096, 0);
  for (int s = 0; s < 4; ++s) {
    set_grads(a, s), set_grads(b, s);
    fused.step(), disk.step();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "step " << s << " param " << i;
  }
  const DiskStepStats& last = disk.last_step();
  EXPECT_GT(last.chunks, 2) << "32 KiB chunks over about 200 KiB of moments";
  EXPECT_EQ(last.bytes_read, last.bytes_written);
  for (size_t i = 0; i < a.size(); ++i) {
    const auto want = state_tensors(*fused.state().at(a[i].unsafeGetTensorImpl()), a[i]);
    const auto got = state_tensors(*disk.state().at(b[i].unsafeGetTensorImpl()), b[i]);
    for (const char* m : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(torch::equal(want.at(m).tensor, got.at(m).tensor)) << m << " of param " << i;
    }
    EXPECT_EQ(state_step(*disk.state().at(b[i].unsafeGetTensorImpl())),
              state_step(*fused.state().at(a[i].unsafeGetTensorImpl())));
  }
}

// A checkpoint's round trip: every state read out (from disk), installed in a fresh optimizer (held in memory until
// its next step puts it on disk), and that step equal to the first optimizer's next.
TEST(DiskAdamW, StateReadOutAndInstalledContinuesAlike) {
  testing::TempDir dir("disk_adamw_");
  auto a = make_params(), b = make_params();
  DiskAdamW first(groups_of(a), torch::optim::AdamWOptions(), disk_options(dir.path));
  for (int s = 0; s < 2; ++s) set_grads(a, s), first.step();
  for (size_t i = 0; i < a.size(); ++i) b[i].detach().copy_(a[i].detach());
  DiskAdamW second(groups_of(b), torch::optim::AdamWOptions(), {dir.path, "optimizer-second", 32 << 10});
  for (size_t i = 0; i < a.size(); ++i) {
    const auto saved = state_tensors(*first.state().at(a[i].unsafeGetTensorImpl()), a[i]);
    install_empty_state(second, b[i], state_step(*first.state().at(a[i].unsafeGetTensorImpl())));
    // As the checkpoint's loader does: the installed state's tensors asked for again, then filled.
    for (auto& [name, t] : state_tensors(*second.state().at(b[i].unsafeGetTensorImpl()), b[i])) {
      t.tensor.copy_(saved.at(name).tensor);
    }
  }
  set_grads(a, 2), set_grads(b, 2);
  first.step(), second.step();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
}

// The staging buffers are the host memory a step allocates: two chunks (the largest parameter's moments where one
// is larger), not the state.
TEST(DiskAdamW, HostMemoryHoldsTwoChunks) {
  memory::install_cpu_memory_counter();
  testing::TempDir dir("disk_adamw_");
  torch::manual_seed(2);
  std::vector<at::Tensor> p;
  for (int i = 0; i < 64; ++i) p.push_back(torch::randn({1024}).requires_grad_(true));  // 8 KiB of moments each
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(p, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  DiskAdamW disk(std::move(g), torch::optim::AdamWOptions(), {dir.path, "optimizer-memory", 64 << 10});
  for (auto& t : p) t.mutable_grad() = torch::ones_like(t);
  memory::reset_cpu_peak();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  disk.step();
  const int64_t held = memory::cpu_memory_stats().current_bytes - before;
  EXPECT_EQ(disk.last_step().chunks, 8);  // 512 KiB of moments in 64 KiB chunks
  EXPECT_LE(held, 2 * ((64 << 10) + 4096) + 4096) << "two staging buffers, not the 512 KiB of moments";
  EXPECT_EQ(disk.last_step().bytes_read, 64 * 8192);
}

TEST(DiskAdamW, BadInputIsNamed) {
  testing::TempDir dir("disk_adamw_");
  auto p = make_params();
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(std::vector<at::Tensor>{p[0]},
                 std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-3).amsgrad(true)));
  testing::expect_error<std::invalid_argument>(
      [&] { DiskAdamW(std::move(g), torch::optim::AdamWOptions(), disk_options(dir.path)); }, {"AMSGrad"});
  testing::expect_error<std::invalid_argument>(
      [&] { DiskAdamW(groups_of(p), torch::optim::AdamWOptions(), disk_options(dir.path + "/nowhere")); },
      {"nowhere", "expected an existing directory"});
  at::Tensor strided = torch::randn({8, 8}).t().requires_grad_(true);  // not contiguous
  std::vector<torch::optim::OptimizerParamGroup> g2;
  g2.emplace_back(std::vector<at::Tensor>{strided}, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  DiskAdamW disk(std::move(g2), torch::optim::AdamWOptions(), disk_options(dir.path));
  strided.mutable_grad() = torch::ones({8, 8});
  testing::expect_error<std::invalid_argument>([&] { disk.step(); }, {"[8, 8]", "contiguous"});
}

}  // namespace
}  // namespace shardtrain::optim
