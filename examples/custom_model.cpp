// Bring your own model: a module tree of your own, not from the zoo, trained with fully_shard (FULL_SHARD over
// every rank), activation checkpointing, bf16 mixed precision, a sharded checkpoint every 5 steps, and resume.
//   build/shardtrain launch --nproc-per-node 2 -- build/custom_model_example runs/custom 20   # steps 1..20
// Run it again with more steps and it continues from the newest checkpoint in runs/custom.
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/distributed/mesh.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/intercept.h"

namespace st = shardtrain;
constexpr int64_t kDim = 64, kBatch = 16;  // width; samples per rank per step

// A layer becomes shardable and checkpointable by deriving from nn::Interceptable and naming its body forward_impl.
struct BlockImpl : st::nn::Interceptable<BlockImpl, at::Tensor(at::Tensor)> {
  BlockImpl()
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        up(register_module("up", torch::nn::Linear(kDim, 4 * kDim))),
        down(register_module("down", torch::nn::Linear(4 * kDim, kDim))) {}
  at::Tensor forward_impl(at::Tensor x) { return x + down(torch::gelu(up(norm(x)))); }  // (B, kDim) -> (B, kDim)
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

struct NetImpl : st::nn::Interceptable<NetImpl, at::Tensor(at::Tensor)> {
  NetImpl() : head(register_module("head", torch::nn::Linear(kDim, 1))) {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block()));
  }
  at::Tensor forward_impl(at::Tensor x) {  // (B, kDim) -> (B, 1)
    for (Block& b : blocks) x = b(x);
    return head(x);
  }
  std::vector<Block> blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

// Rank `rank`'s batch of `step`, the same in every run: inputs and a target the model can learn.
std::pair<at::Tensor, at::Tensor> batch(int64_t step, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(step * 1000 + rank));
  at::Tensor x = at::randn({kBatch, kDim}, gen, at::kFloat);
  return {x, at::tanh(x.slice(1, 0, 8).sum(1, true) / 3)};
}

int main(int argc, char** argv) try {
  if (argc != 3) throw std::invalid_argument("usage: custom_model_example CHECKPOINT_DIR STEPS");
  const std::string dir = argv[1];
  const int64_t steps = std::stoll(argv[2]);
  st::dist::ProcessGroup pg = st::dist::ProcessGroup::init(st::dist::read_dist_env(st::dist::process_env_lookup()));
  st::dist::DeviceMesh mesh = st::dist::DeviceMesh::create(pg, /*replicate=*/1);

  torch::manual_seed(0);  // the same initial weights on every rank
  Net net;
  st::fsdp::FsdpOptions fsdp;
  fsdp.mixed_precision.param_dtype = at::kBFloat16;  // gather and compute in bf16, reduce gradients in float32
  fsdp.mixed_precision.reduce_dtype = at::kFloat;
  for (Block& b : net->blocks) {
    st::nn::apply_activation_checkpoint(*b);  // keep only each block's input; replay it in backward
    st::fsdp::fully_shard(b.ptr(), mesh.world(), fsdp);
  }
  st::fsdp::fully_shard(net.ptr(), mesh.world(), fsdp);  // the root last: it holds the head
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(3e-3));  // sees this rank's shards
  const st::ckpt::CheckpointModel saved{net.ptr(), &optimizer, /*sharded=*/true, {}};

  st::ckpt::TrainerState state;
  state.world_size = pg.world_size();
  state.run_id = "custom-model-example";
  if (auto latest = st::ckpt::latest_checkpoint(dir)) state = st::ckpt::load_checkpoint(*latest, saved, pg.world());
  for (int64_t step = state.step + 1; step <= steps; ++step) {
    auto [x, y] = batch(step, pg.rank());
    at::Tensor loss = torch::mse_loss(net(x).to(at::kFloat), y);
    optimizer.zero_grad();
    loss.backward();  // gradients arrive sharded and averaged over the ranks
    optimizer.step();
    at::Tensor mean = loss.detach() / pg.world_size();
    pg.world().all_reduce(mean, st::dist::ReduceOp::SUM).wait();
    if (pg.rank() == 0) std::printf("step %lld loss %.9g\n", static_cast<long long>(step), mean.item<double>());
    if (step % 5 == 0 || step == steps) {
      state.step = step;
      st::ckpt::save_checkpoint(dir, state, saved, pg.world());
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_model_example: %s\n", e.what());
  return 1;
}
