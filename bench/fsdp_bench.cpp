// One side of bench/fsdp_vs_torch.py: trains the benchmark model (a stack of pre-norm MLP blocks) for N steps in
// one of our modes and prints one RESULT line (JSON) on rank 0: median step time, peak CPU bytes (our counting
// allocator) overall and in each phase of a step (forward with the loss, backward, zero_grad + optimizer step),
// and the global loss of every step. Run under `shardtrain launch`.
//
//   fsdp_bench --write-inputs DIR          initial weights (DIR/init.pt) and batches (DIR/data.pt), one process
//   fsdp_bench --mode M --inputs DIR       M = plain | full_shard | shard_grad_op | ddp | ddp_bucket_view
//              [--checkpoint]              activation checkpointing of every block
// The weights and batches are read from files so that PyTorch (bench/torch_reference.py) trains the very same.
#include <torch/torch.h>

#include <iostream>
#include <string>

#include "shardtrain/ddp/replicate.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/io/files.h"
#include "shardtrain/io/pickle_files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/nn/intercept.h"
#include "bench_loop.h"

namespace {

using namespace shardtrain;

struct Args {
  std::string mode = "plain";
  std::string inputs;
  std::string write_inputs;
  int64_t dim = 384, blocks = 6, batch = 64, steps = 20, warmup = 3;
  bool checkpoint = false;
};

struct BlockImpl : nn::Interceptable<BlockImpl, at::Tensor(at::Tensor)> {
  explicit BlockImpl(int64_t d) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
    fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
  }
  at::Tensor forward_impl(at::Tensor x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Parameter names match bench/torch_reference.py's Model: embed.*, blocks.<i>.{norm,fc1,fc2}.*, norm.*, head.*.
struct ModelImpl : nn::Interceptable<ModelImpl, at::Tensor(at::Tensor)> {
  ModelImpl(int64_t d, int64_t n) {
    embed = register_module("embed", torch::nn::Linear(d, d));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < n; ++i) blocks->push_back(std::make_shared<BlockImpl>(d));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    head = register_module("head", torch::nn::Linear(d, d));
  }
  at::Tensor forward_impl(at::Tensor x) {
    x = embed(x);
    for (auto& b : *blocks) x = b->as<BlockImpl>()->forward(x);
    return head(norm(x));
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&] { return bench::option_value(argc, argv, i); };
    if (k == "--mode") a.mode = value();
    else if (k == "--inputs") a.inputs = value();
    else if (k == "--write-inputs") a.write_inputs = value();
    else if (k == "--dim") a.dim = std::stoll(value());
    else if (k == "--blocks") a.blocks = std::stoll(value());
    else if (k == "--batch") a.batch = std::stoll(value());
    else if (k == "--steps") a.steps = std::stoll(value());
    else if (k == "--warmup") a.warmup = std::stoll(value());
    else if (k == "--checkpoint") a.checkpoint = true;
    else throw std::invalid_argument("unknown option " + k);
  }
  return a;
}

std::map<std::string, at::Tensor> load_tensors(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : io::load_pickle(path).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

void save_tensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [k, v] : tensors) dict.insert(k, v);
  io::save_pickle(path, dict);  // torch.load reads it with its defaults
}

int run(const Args& a) {
  memory::install_cpu_memory_counter();
  if (!a.write_inputs.empty()) {
    torch::manual_seed(0);
    auto model = std::make_shared<ModelImpl>(a.dim, a.blocks);
    std::map<std::string, at::Tensor> init;
    for (const auto& p : model->named_parameters()) init[p.key()] = p.value().detach();
    io::make_directories(a.write_inputs);
    save_tensors(a.write_inputs + "/init.pt", init);
    const int64_t n = a.steps + a.warmup;
    save_tensors(a.write_inputs + "/data.pt",
                 {{"x", torch::randn({n, a.batch, a.dim})}, {"y", torch::randn({n, a.batch, a.dim})}});
    return 0;
  }
  dist::ProcessGroup pg = dist::ProcessGroup::init(dist::read_dist_env(dist::process_env_lookup()));
  const dist::Communicator& world = pg.world();
  const int w = world.size(), rank = world.rank();
  if (a.batch % w != 0) throw std::invalid_argument("--batch " + std::to_string(a.batch) + " is not a multiple of W");
  auto model = std::make_shared<ModelImpl>(a.dim, a.blocks);
  {
    torch::NoGradGuard no_grad;
    auto init = load_tensors(a.inputs + "/init.pt");
    for (auto& p : model->named_parameters()) p.value().copy_(init.at(p.key()));
  }
  auto data = load_tensors(a.inputs + "/data.pt");
  std::optional<ddp::Ddp> ddp_handle;
  if (a.checkpoint) {
    for (auto& b : *model->blocks) nn::apply_activation_checkpoint(*b);
  }
  if (a.mode == "full_shard" || a.mode == "shard_grad_op") {
    fsdp::FsdpOptions options;
    options.reshard_after_forward = a.mode == "full_shard";
    for (auto& b : *model->blocks) fsdp::fully_shard(b, world, options);
    fsdp::fully_shard(model, world, options);
  } else if (a.mode == "ddp" || a.mode == "ddp_bucket_view") {
    ddp::DdpOptions options;
    options.gradient_as_bucket_view = a.mode == "ddp_bucket_view";
    ddp_handle = ddp::replicate(model, world, options);
  } else if (a.mode != "plain") {
    throw std::invalid_argument("--mode " + a.mode +
                                ": expected plain, full_shard, shard_grad_op, ddp or ddp_bucket_view");
  }
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  const int64_t local = a.batch / w;
  const bench::StepLoop result = bench::run_steps(world, a.steps, a.warmup, [&](int64_t s) {
    at::Tensor x = data.at("x")[s].narrow(0, rank * local, local), y = data.at("y")[s].narrow(0, rank * local, local);
    return torch::mse_loss(model->forward(x), y);
  }, optimizer);
  bench::print_result(world, "\"impl\": \"shardtrain\", \"mode\": \"" + a.mode + "\", \"checkpoint\": " +
                                 (a.checkpoint ? "true" : "false") + ", \"world\": " + std::to_string(w),
                      result, static_cast<size_t>(a.warmup));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "fsdp_bench: " << e.what() << "\n";
    return 1;
  }
}
