// Tensor parallelism (models/tensor_parallel.h) at every world size the binary runs at:
//  - the regions' functions (tp/regions.h) move what their table says, forward and backward;
//  - Llama, Mistral, Qwen2 (biases on q, k, v), Qwen3 (per-head q/k norms) and GPT-2 (a fused q, k, v split by
//    thirds, learned positions, a vocabulary that does not divide), their heads separate or tied to the token
//    embedding (Llama 3.2, Qwen's small ones, GPT-2: one table split for both), split over tp ranks and, on the rest
//    of the world, sharded by FSDP over the data-parallel ranks, with and without sequence parallelism and
//    activation checkpointing, train as one process on the whole batch does: the losses, the gradient norms that
//    clip, and every parameter (this rank's slice of it) after three SGD steps within a float32 rounding of one
//    process's, after three AdamW steps within what Adam makes of rounding in near-zero gradients;
//  - ViT, BERT, T5 and FLAVA, their layers split and the rest whole, as one process too;
//  - LoRA adapters split with their projections, training as one process's;
//  - sizes that do not divide are refused naming what is wrong, before any change.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "shardtrain/distributed/mesh.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/models/bert.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/synthetic_batch.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/tensor_parallel.h"
#include "shardtrain/models/vit.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/optim/adafactor.h"
#include "shardtrain/tp/regions.h"
#include "shardtrain/tp/split.h"
#include "support/expect_error.h"
#include "test_env.h"

namespace shardtrain::models {
namespace {

using testing::test_process_group;

// Rank r's tensor: (2, 4 * W) with values that tell ranks and positions apart.
at::Tensor rank_tensor(int r, int w) { return at::arange(8 * w, at::kDouble).view({2, 4 * w}) + 1000 * r; }

TEST(TensorParallel, RegionsMoveWhatTheySay) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size(), r = world.rank();
  at::Tensor sum = at::zeros({2, 4 * w}, at::kDouble);
  for (int k = 0; k < w; ++k) sum += rank_tensor(k, w);
  // copy_to_group: forward as it is; backward the sum of the ranks' gradients.
  {
    at::Tensor x = rank_tensor(r, w).requires_grad_();
    at::Tensor y = tp::copy_to_group(x, world);
    EXPECT_TRUE(at::equal(y, x));
    y.backward(rank_tensor(r, w));
    EXPECT_TRUE(at::equal(x.grad(), sum));
  }
  // reduce_from_group: forward the sum; backward as it is.
  {
    at::Tensor x = rank_tensor(r, w).requires_grad_();
    at::Tensor y = tp::reduce_from_group(x, world);
    EXPECT_TRUE(at::equal(y, sum));
    y.backward(rank_tensor(r, w));
    EXPECT_TRUE(at::equal(x.grad(), rank_tensor(r, w)));
  }
  // gather_along dim 1: rank k's columns at k; backward this rank's columns of the summed gradient.
  {
    at::Tensor x = rank_tensor(r, w).requires_grad_();
    at::Tensor y = tp::gather_along(x, 1, world);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 4 * w * w}));
    for (int k = 0; k < w; ++k) EXPECT_TRUE(at::equal(y.narrow(1, 4 * w * k, 4 * w), rank_tensor(k, w)));
    at::Tensor g = at::arange(y.numel(), at::kDouble).view(y.sizes()) * (r + 1);
    y.backward(g);
    const double ranks_sum = w * (w + 1) / 2.0;
    EXPECT_TRUE(at::equal(x.grad(), (at::arange(y.numel(), at::kDouble).view(y.sizes()) * ranks_sum)
                                        .narrow(1, 4 * w * r, 4 * w)));
  }
  // reduce_scatter_along dim 1: this rank's columns of the sum; backward the ranks' gradients side by side.
  {
    at::Tensor x = rank_tensor(r, w).requires_grad_();
    at::Tensor y = tp::reduce_scatter_along(x, 1, world);
    EXPECT_TRUE(at::equal(y, sum.narrow(1, 4 * r, 4)));
    y.backward(at::full({2, 4}, static_cast<double>(r)));
    for (int k = 0; k < w; ++k) EXPECT_TRUE(at::equal(x.grad().narrow(1, 4 * k, 4), at::full({2, 4}, double(k))));
  }
  // split_along dim 1: this rank's columns; backward the gradients side by side.
  {
    at::Tensor x = rank_tensor(0, w).requires_grad_();
    at::Tensor y = tp::split_along(x, 1, world);
    EXPECT_TRUE(at::equal(y, rank_tensor(0, w).narrow(1, 4 * r, 4)));
    y.backward(at::full({2, 4}, static_cast<double>(r)));
    for (int k = 0; k < w; ++k) EXPECT_TRUE(at::equal(x.grad().narrow(1, 4 * k, 4), at::full({2, 4}, double(k))));
  }
  if (w > 1) {
    testing::expect_error<std::invalid_argument>(
        [&] { tp::reduce_scatter_along(at::zeros({2, 4 * w + 1}), 1, world); },
        {"dimension 1 of [2, " + std::to_string(4 * w + 1) + "]", "does not divide", std::to_string(w) + " ranks"});
  }
}

// A recipe from a flavor's config.json with keys changed (an untied Qwen: the plan splits no tied table).
std::shared_ptr<const ModelRecipe> edited_recipe(const std::string& flavor,
                                                 const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string json = recipe_of(flavor)->hf_config_json();
  for (const auto& [from, to] : edits) {
    const size_t at = json.find(from);
    if (at == std::string::npos) throw std::logic_error(flavor + "'s config.json has no " + from);
    json.replace(at, from.size(), to);
  }
  const std::string path = "/tmp/shardtrain-tp-" + std::to_string(getpid()) + "-" +
                           std::to_string(test_process_group().rank()) + ".json";
  std::ofstream(path) << json;
  auto recipe = recipe_from_hf_config(path);
  std::remove(path.c_str());
  return recipe;
}

// dp data-parallel ranks (replicate x dp / replicate: HYBRID_SHARD when replicate > 1, else FULL_SHARD) of tp ranks.
struct Layout {
  int dp, tp;
  bool sequence_parallel;
  int64_t checkpoint_every;
  int replicate = 1;
  std::string text() const {
    return (replicate > 1 ? "hybrid " + std::to_string(replicate) + " x " + std::to_string(dp / replicate)
                          : "dp " + std::to_string(dp)) +
           " x tp " + std::to_string(tp) + (sequence_parallel ? ", sequence parallel" : "") +
           (checkpoint_every > 0 ? ", checkpointed" : "");
  }
};

// The loss of a causal LM of the zoo (Llama's decoders, GPT-2) on ids, every label counted.
at::Tensor causal_lm_loss(torch::nn::Module& model, const at::Tensor& ids) {
  if (auto* gpt2 = dynamic_cast<Gpt2Impl*>(&model)) return gpt2->run(ids, {}, ids, /*labelled_only=*/true).loss;
  return dynamic_cast<LlamaImpl&>(model).run(ids, {}, ids, /*labelled_only=*/true).loss;
}

// This rank's part of the whole parameter `name` (whole when it is not split).
at::Tensor part_of(const at::Tensor& whole, const std::map<std::string, tp::SplitLayout>& layouts,
                   const std::string& name, const dist::Communicator& group) {
  auto it = layouts.find(name);
  return it == layouts.end() ? whole : tp::slice_of(whole, it->second, group.rank(), group.size());
}

// SGD shows the arithmetic: every parameter within 2 float32 roundings of one process's (1.2e-7 measured). Adam
// divides each gradient by its own root mean square, so where a true gradient is near zero rounding noise becomes
// a step of up to lr: 4.5e-5 measured at lr 1e-3 (Qwen's MLP), as under FSDP alone (models_test.cpp). Adafactor
// (its statistics over whole matrices: summed over the group's slices and FSDP's rows) likewise, at its relative
// step of 1e-2 scaled by each parameter's RMS.
enum class Optimizer { SGD, ADAMW, ADAFACTOR };

std::string to_string(Optimizer o) { return o == Optimizer::SGD ? "SGD" : o == Optimizer::ADAMW ? "AdamW" : "Adafactor"; }

// The reference's with neither split given.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer which, const std::vector<at::Tensor>& params,
                                                        std::optional<optim::RowSharding> rows = std::nullopt,
                                                        std::optional<optim::TensorSplit> slices = std::nullopt) {
  if (which == Optimizer::SGD) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  if (which == Optimizer::ADAFACTOR) {
    // No update clipping: with it a wrong parameter RMS (which scales the step) and a wrong update RMS (which
    // divides it) would cancel.
    return std::make_unique<optim::Adafactor>(params, optim::AdafactorOptions{}.clip_threshold(1e3), std::move(rows),
                                              std::move(slices));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
}

// kMaxNorm: below the gradients' norm at every step, so that the norm over every slice of every rank is what clips.
void expect_trains_like_one_process(const std::string& name, const std::shared_ptr<const ModelRecipe>& recipe,
                                    const Layout& layout, Optimizer optimizer, double kMaxNorm = 0.5) {
  constexpr int kSteps = 3;
  const double tolerance = optimizer == Optimizer::SGD ? 2.5e-7 : 1e-4;
  const std::string label = name + ", " + layout.text() + ", " + to_string(optimizer);
  BuildOptions build;
  build.init.seed = 7;
  torch::manual_seed(3);
  const at::Tensor ids = torch::randint(996, {12, 24}, torch::kLong);  // dp = 1..4 divide 12 rows, tp 24 tokens
  // Reference: one process, the whole batch.
  ZooModel reference = build_model(std::shared_ptr<const ModelRecipe>(recipe), build);
  std::vector<double> ref_losses, ref_norms;
  {
    auto step = make_optimizer(optimizer, reference.module->parameters());
    for (int s = 0; s < kSteps; ++s) {
      step->zero_grad();
      at::Tensor loss = causal_lm_loss(*reference.module, ids);
      loss.backward();
      ref_norms.push_back(torch::nn::utils::clip_grad_norm_(reference.module->parameters(), kMaxNorm));
      step->step();
      ref_losses.push_back(loss.item<double>());
    }
  }
  const auto mesh =
      dist::DeviceMesh::create(test_process_group(), layout.replicate, layout.dp / layout.replicate, layout.tp);
  ZooModel model = build_model(std::shared_ptr<const ModelRecipe>(recipe), build);
  TensorParallel tp = tensor_parallelize(model, mesh.tp_group(), {layout.sequence_parallel});
  const auto layouts = tp.split_layouts(*model.module);
  if (layout.dp > 1) {
    ParallelizeOptions options;
    options.activation_checkpoint_every = layout.checkpoint_every;
    if (layout.replicate > 1) options.strategy = parallel::Strategy::HYBRID_SHARD;
    parallelize(model, mesh, options);
  } else if (layout.checkpoint_every > 0) {
    activation_checkpoint_layers(model, layout.checkpoint_every);
  }
  const int64_t rows = ids.size(0) / layout.dp;
  const at::Tensor local = ids.narrow(0, mesh.data_rank() * rows, rows);
  auto step = make_optimizer(optimizer, model.module->parameters(),
                             layout.dp > 1 ? std::optional<optim::RowSharding>(fsdp::row_sharding(model.module))
                                           : std::nullopt,
                             tp.tensor_split());
  for (int s = 0; s < kSteps; ++s) {
    step->zero_grad();
    at::Tensor loss = causal_lm_loss(*model.module, local);
    loss.backward();
    tp.reduce_gradients();
    const dist::Communicator* shards = layout.replicate > 1 ? &mesh.shard_group()
                                       : layout.dp > 1      ? &mesh.data_group()
                                                            : nullptr;
    const double norm = tp.clip_grad_norm(*model.module, kMaxNorm, shards);
    EXPECT_GT(ref_norms[s], kMaxNorm) << label << ": the reference's gradients are not clipped";
    EXPECT_NEAR(norm, ref_norms[s], 1e-5 * ref_norms[s]) << label << ": gradient norm at step " << s;
    step->step();
    at::Tensor mean = loss.detach().to(at::kDouble).reshape({1}).clone();
    mesh.data_group().all_reduce(mean, dist::ReduceOp::MEAN).wait();
    EXPECT_NEAR(mean.item<double>(), ref_losses[s], 1e-5 * ref_losses[s]) << label << ": loss at step " << s;
  }
  std::map<std::string, at::Tensor> ours;
  if (layout.dp > 1) {
    ours = fsdp::gather_full_parameters(model.module);
  } else {
    for (const auto& p : model.module->named_parameters()) ours[p.key()] = p.value().detach();
  }
  ASSERT_EQ(ours.size(), reference.module->named_parameters().size()) << label;
  for (const auto& p : reference.module->named_parameters()) {
    ASSERT_TRUE(ours.count(p.key())) << label << " " << p.key();
    const at::Tensor expected = part_of(p.value(), layouts, p.key(), mesh.tp_group());
    ASSERT_EQ(expected.sizes(), ours.at(p.key()).sizes()) << label << " " << p.key();
    EXPECT_LE((ours.at(p.key()) - expected).abs().max().item<double>(), tolerance) << label << " " << p.key();
  }
}

std::vector<Layout> layouts(int w) {
  std::vector<Layout> out;
  for (int tp : {2, 3, 4}) {
    if (w % tp != 0) continue;
    for (bool sp : {false, true}) {
      for (int64_t every : {0, 1}) out.push_back({w / tp, tp, sp, every});
    }
  }
  return out;
}

TEST(TensorParallel, LlamaFamiliesTrainLikeOneProcess) {
  const int w = test_process_group().world_size();
  if (w == 1) GTEST_SKIP() << "tensor parallelism needs two ranks or more";
  if (w == 8) {  // the 3-D mesh: HYBRID_SHARD 2 x 2 over the data-parallel ranks, tp 2 within
    const auto llama = recipe_of_model("llama-debug", {{"kv_heads", 4}});
    for (bool sp : {false, true}) {
      expect_trains_like_one_process("llama-debug", llama, {4, 2, sp, 1, /*replicate=*/2}, Optimizer::SGD);
    }
    return;
  }
  if (w == 3) {  // every split size a multiple of 3 (and the vocabulary of 996 = 3 x 332 tokens)
    const auto thirds = recipe_of_model(
        "llama-debug", {{"heads", 6}, {"kv_heads", 3}, {"head_dim", 16}, {"mlp_dim", 96}, {"vocab_size", 996}});
    // GPT-2 in thirds, its 1000-token vocabulary split 334 + 333 + 333.
    const auto gpt2 = recipe_of_model("gpt2-debug", {{"heads", 6}, {"dim", 96}, {"mlp_dim", 192}, {"dropout", 0}});
    for (const Layout& layout : layouts(w)) {
      expect_trains_like_one_process("llama-debug in thirds", thirds, layout, Optimizer::SGD);
      expect_trains_like_one_process("gpt2-debug in thirds", gpt2, layout, Optimizer::SGD);
    }
    return;
  }
  // Four key/value heads, so that tp = 4 splits them.
  const auto llama = recipe_of_model("llama-debug", {{"kv_heads", 4}});
  const auto qwen2 = edited_recipe("qwen2-debug", {{"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false"},
                                                   {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4"}});
  const auto qwen3 = edited_recipe("qwen3-debug", {{"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false"},
                                                   {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4"}});
  const auto mistral = recipe_of_model("mistral-debug", {{"kv_heads", 4}});
  // A vocabulary of 1001 tokens: 501 + 500 rows, or 251 + 250 x 3. No dropout: neither side draws.
  const auto gpt2 = recipe_of_model("gpt2-debug", {{"vocab_size", 1001}, {"dropout", 0}});
  for (const Layout& layout : layouts(w)) {
    expect_trains_like_one_process("llama-debug", llama, layout, Optimizer::SGD);
    expect_trains_like_one_process("gpt2-debug", gpt2, layout, Optimizer::SGD);
    if (layout.sequence_parallel == (layout.checkpoint_every > 0)) {  // the families' own parts, half the grid each
      expect_trains_like_one_process("qwen2-debug untied", qwen2, layout, Optimizer::SGD);
      expect_trains_like_one_process("qwen3-debug untied", qwen3, layout, Optimizer::SGD);
      expect_trains_like_one_process("mistral-debug", mistral, layout, Optimizer::SGD);
      expect_trains_like_one_process("qwen3-debug untied", qwen3, layout, Optimizer::ADAMW);
    }
    // A table shared by the lookups and the head, split once for both; 2 key/value heads, at tp 4 each held by two
    // ranks (Qwen3's per-head k_norm on both).
    expect_trains_like_one_process("llama-3.2-debug", recipe_of("llama-3.2-debug"), layout, Optimizer::SGD);
    if (!layout.sequence_parallel && layout.checkpoint_every == 0) {  // Adafactor's statistics over the slices
      expect_trains_like_one_process("llama-3.2-debug", recipe_of("llama-3.2-debug"), layout, Optimizer::ADAFACTOR);
      expect_trains_like_one_process("gpt2-debug", gpt2, layout, Optimizer::ADAFACTOR);
    }
    if (layout.sequence_parallel != (layout.checkpoint_every > 0)) {
      expect_trains_like_one_process("qwen2-debug", recipe_of("qwen2-debug"), layout, Optimizer::SGD);
      expect_trains_like_one_process("qwen3-debug", recipe_of("qwen3-debug"), layout, Optimizer::SGD);
    }
  }
}

// LoRA adapters on every projection of the layers split with them (the factor on the split side as its weight, the
// other whole, its gradient summed): GPT-2's fused c_attn by thirds, Llama 3.2's two key/value heads each on two
// ranks at tp 4, the base weights frozen.
TEST(TensorParallel, LoraAdaptersTrainLikeOneProcess) {
  const int w = test_process_group().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "tensor-parallel LoRA runs at 2 and 4 ranks";
  LoraSpec lora;
  lora.r = 4;
  lora.lora_alpha = 16;
  lora.target_modules = {"all-linear"};
  const auto llama = with_lora(recipe_of("llama-3.2-debug"), lora);
  const auto gpt2 = with_lora(recipe_of_model("gpt2-debug", {{"vocab_size", 1001}, {"dropout", 0}}), lora);
  // The adapters' gradients are small (B starts at zero): a bound below them.
  constexpr double kMaxNorm = 0.02;
  for (const Layout& layout : layouts(w)) {  // half the grid each
    if (layout.sequence_parallel == (layout.checkpoint_every > 0)) {
      expect_trains_like_one_process("llama-3.2-debug + LoRA", llama, layout, Optimizer::SGD, kMaxNorm);
    } else {
      expect_trains_like_one_process("gpt2-debug + LoRA", gpt2, layout,
                                     layout.sequence_parallel ? Optimizer::ADAMW : Optimizer::SGD, kMaxNorm);
    }
  }
}

// Dropout under tensor parallelism (GPT-2's on embeddings, attention probabilities and the residual stream): draws
// where activations are replicated agree across the group, so every rank of it holds the same whole parameters
// after its steps (their gradients come from those activations); draws in the split regions (and under sequence
// parallelism in the whole layer) are each rank's own (tp/rng_fork.h), and activation checkpointing replays them: a
// checkpointed run's losses and parameters are the run's without.
TEST(TensorParallel, DropoutDrawsPerRankAndReplaysUnderCheckpointing) {
  const int w = test_process_group().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "runs at 2 and 4 ranks";
  const auto gpt2 = recipe_of_model("gpt2-debug", {{"vocab_size", 1001}, {"dropout", 0.2}});
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1, w / 2, 2);
  torch::manual_seed(3);
  const at::Tensor ids = torch::randint(1001, {4, 24}, torch::kLong).narrow(0, 2 * (mesh.data_rank() % 2), 2);
  for (bool sp : {false, true}) {
    std::vector<std::map<std::string, at::Tensor>> params;
    std::vector<std::vector<double>> losses;
    for (int64_t every : {0, 1}) {
      const std::string label = std::string(sp ? "sequence parallel" : "tp 2") + (every ? ", checkpointed" : "");
      BuildOptions build;
      build.init.seed = 7;
      ZooModel model = build_model(std::shared_ptr<const ModelRecipe>(gpt2), build);
      TensorParallel tp = tensor_parallelize(model, mesh.tp_group(), {sp});
      if (every > 0) activation_checkpoint_layers(model, every);
      model.module->train();
      torch::optim::SGD step(model.module->parameters(), torch::optim::SGDOptions(0.1));
      at::manual_seed(static_cast<uint64_t>(17 + mesh.data_rank()));  // the group alike, as the trainer seeds
      losses.emplace_back();
      for (int s = 0; s < 2; ++s) {
        step.zero_grad();
        at::Tensor loss = causal_lm_loss(*model.module, ids);
        loss.backward();
        tp.reduce_gradients();
        step.step();
        losses.back().push_back(loss.item<double>());
      }
      for (const auto& p : model.module->named_parameters()) {
        if (tp.split_of(p.value()) != nullptr) continue;
        at::Tensor mine = p.value().detach().to(at::kDouble).reshape({-1}), sum = mine.clone();
        mesh.tp_group().all_reduce(sum, dist::ReduceOp::SUM).wait();
        EXPECT_LE((sum / 2 - mine).abs().max().item<double>(), 1e-7) << label << ": " << p.key() << " across the group";
      }
      params.emplace_back();
      for (const auto& p : model.module->named_parameters()) params.back()[p.key()] = p.value().detach().clone();
    }
    for (size_t s = 0; s < losses[0].size(); ++s) {
      EXPECT_NEAR(losses[1][s], losses[0][s], 1e-6 * losses[0][s]) << (sp ? "sp" : "tp") << ", step " << s;
    }
    for (const auto& [name, value] : params[0]) {
      EXPECT_LE((params[1].at(name) - value).abs().max().item<double>(), 1e-6) << (sp ? "sp " : "tp ") << name;
    }
  }
}

// The loss of rows [first, first + rows) of a fixed global batch.
using SliceLoss = std::function<at::Tensor(torch::nn::Module& model, int64_t first, int64_t rows)>;

// A family whose plan splits its layers and keeps its head whole (ViT: biases on every projection, GELU's fused MLP;
// BERT: post-norm, the masked-LM head whole; T5: cross-attention by heads, each stack's relative position bias by
// its heads' columns): the same training as one process on the whole batch of 8 (SGD: the arithmetic to float32
// rounding), with and without checkpointing.
void expect_whole_head_family_trains_like_one_process(const std::string& flavor,
                                                     const std::shared_ptr<const ModelRecipe>& recipe,
                                                     const SliceLoss& loss) {
  const int w = test_process_group().world_size();
  const std::vector<std::pair<int, int>> layouts =
      w == 2 ? std::vector<std::pair<int, int>>{{1, 2}} : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}};
  for (const auto& [dp, tp] : layouts) {
    for (int64_t every : {0, 1}) {
      const std::string label = flavor + ", dp " + std::to_string(dp) + " x tp " + std::to_string(tp) +
                                (every ? ", checkpointed" : "");
      BuildOptions build;
      build.init.seed = 5;
      ZooModel reference = build_model(recipe, build);
      torch::optim::SGD ref_sgd(reference.module->parameters(), torch::optim::SGDOptions(0.1));
      std::vector<double> ref_losses;
      for (int s = 0; s < 3; ++s) {
        ref_sgd.zero_grad();
        at::Tensor l = loss(*reference.module, 0, 8);
        l.backward();
        ref_sgd.step();
        ref_losses.push_back(l.item<double>());
      }
      const auto mesh = dist::DeviceMesh::create(test_process_group(), 1, dp, tp);
      ZooModel model = build_model(recipe, build);
      TensorParallel split = tensor_parallelize(model, mesh.tp_group());
      const auto layouts = split.split_layouts(*model.module);
      ParallelizeOptions options;
      options.activation_checkpoint_every = every;
      if (dp > 1) parallelize(model, mesh, options);
      if (dp == 1 && every > 0) activation_checkpoint_layers(model, every);
      const int64_t rows = 8 / dp;
      torch::optim::SGD sgd(model.module->parameters(), torch::optim::SGDOptions(0.1));
      for (int s = 0; s < 3; ++s) {
        sgd.zero_grad();
        at::Tensor l = loss(*model.module, mesh.data_rank() * rows, rows);
        l.backward();
        split.reduce_gradients();
        sgd.step();
        at::Tensor mean = l.detach().to(at::kDouble).reshape({1}).clone();
        mesh.data_group().all_reduce(mean, dist::ReduceOp::MEAN).wait();
        EXPECT_NEAR(mean.item<double>(), ref_losses[s], 1e-5 * ref_losses[s]) << label << ": loss at step " << s;
      }
      std::map<std::string, at::Tensor> ours;
      if (dp > 1) {
        ours = fsdp::gather_full_parameters(model.module);
      } else {
        for (const auto& p : model.module->named_parameters()) ours[p.key()] = p.value().detach();
      }
      for (const auto& p : reference.module->named_parameters()) {
        ASSERT_TRUE(ours.count(p.key())) << label << " " << p.key();
        const at::Tensor expected = part_of(p.value(), layouts, p.key(), mesh.tp_group());
        EXPECT_LE((ours.at(p.key()) - expected).abs().max().item<double>(), 2.5e-7) << label << " " << p.key();
      }
    }
  }
}

TEST(TensorParallel, WholeHeadFamiliesTrainLikeOneProcess) {
  const int w = test_process_group().world_size();
  if (w == 1 || w == 3 || w == 8) GTEST_SKIP() << "the debug flavors' 4 heads split over 2 or 4 ranks";
  torch::manual_seed(4);
  const at::Tensor pixels = at::randn({8, 3, 32, 32});
  const at::Tensor classes = at::randint(10, {8}, at::kLong);
  expect_whole_head_family_trains_like_one_process(
      "vit-debug", recipe_of("vit-debug"), [&](torch::nn::Module& m, int64_t first, int64_t rows) {
        return dynamic_cast<VitImpl&>(m).run(pixels.narrow(0, first, rows), classes.narrow(0, first, rows)).loss;
      });
  // Every token labelled, so that each data-parallel rank's mean is over as many as the others'.
  const at::Tensor ids = at::randint(1000, {8, 16}, at::kLong);
  expect_whole_head_family_trains_like_one_process(
      "bert-debug", recipe_of_model("bert-debug", {{"dropout", 0}}),
      [&](torch::nn::Module& m, int64_t first, int64_t rows) {
        const at::Tensor mine = ids.narrow(0, first, rows);
        return dynamic_cast<BertImpl&>(m).run(mine, {}, {}, mine, /*labelled_only=*/true).loss;
      });
  const at::Tensor targets = at::randint(1000, {8, 6}, at::kLong);
  expect_whole_head_family_trains_like_one_process(
      "t5-debug", recipe_of_model("t5-debug", {{"dropout", 0}}),
      [&](torch::nn::Module& m, int64_t first, int64_t rows) {
        return dynamic_cast<T5Impl&>(m)
            .run(ids.narrow(0, first, rows), {}, {}, targets.narrow(0, first, rows), /*labelled_only=*/true)
            .loss;
      });
}

// FLAVA's three encoders split, its embeddings, heads and codebook whole: its pretraining losses (MLM, MIM, ITM,
// contrastive, the masked multimodal ones) on one image-text batch train as one process does (SGD).
TEST(TensorParallel, FlavaTrainsLikeOneProcess) {
  const int w = test_process_group().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "flava-debug's 4 heads split over 2 or 4 ranks";
  const auto recipe = recipe_of("flava-debug");
  const auto task = recipe->task();
  const data::Batch batch = synthetic_batch(task->data_needs(), 4, 16, /*seed=*/3);
  BuildOptions build;
  build.init.seed = 5;
  auto train = [&](ZooModel& model, const TensorParallel* tp) {
    torch::optim::SGD sgd(model.module->parameters(), torch::optim::SGDOptions(0.1));
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      sgd.zero_grad();
      at::Tensor loss = task->compute_losses(*model.module, batch, static_cast<uint64_t>(s)).total;
      loss.backward();
      if (tp != nullptr) tp->reduce_gradients();
      sgd.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  ZooModel reference = build_model(recipe, build);
  const std::vector<double> expected = train(reference, nullptr);
  ZooModel model = build_model(recipe, build);
  const TensorParallel tp = tensor_parallelize(model, test_process_group().world());
  const auto layouts = tp.split_layouts(*model.module);
  const std::vector<double> losses = train(model, &tp);
  for (size_t s = 0; s < losses.size(); ++s) {
    EXPECT_NEAR(losses[s], expected[s], 1e-5 * expected[s]) << "flava-debug at tp " << w << ": loss at step " << s;
  }
  for (const auto& p : reference.module->named_parameters()) {
    const at::Tensor expected_part = part_of(p.value(), layouts, p.key(), test_process_group().world());
    const at::Tensor ours = model.module->named_parameters()[p.key()];
    // Its encoders run twice a step (unmasked, then masked): each gradient a sum of two, the split layers' partial
    // sums in another order. A few float32 roundings: up to 5e-7 measured.
    EXPECT_LE((ours - expected_part).abs().max().item<double>(), 1e-6) << "flava-debug at tp " << w << " " << p.key();
  }
}

// A model split and sharded layer by layer as it is built (build_tensor_parallel) is the one built whole, then
// split, then sharded; a Hugging Face file of the whole model loads into it with each rank reading its slices' rows
// (by rows or by columns; GPT-2's fused c_attn by thirds, its uneven vocabulary), or rank 0 reading and broadcasting
// (sync_module_states), to exactly the whole model's values.
TEST(TensorParallel, BuiltLayerByLayerAndLoadedAsSlices) {
  const int w = test_process_group().world_size();
  if (w != 2 && w != 4) GTEST_SKIP() << "tp 2, with dp 1 or 2";
  // At tp 4, llama-debug's 2 key/value heads each on two ranks.
  std::vector<std::pair<std::shared_ptr<const ModelRecipe>, int>> cases = {
      {recipe_of_model("llama-debug", {{"kv_heads", 4}}), 2},
      {recipe_of_model("gpt2-debug", {{"vocab_size", 1001}}), 2}};
  if (w == 4) cases.emplace_back(recipe_of("llama-debug"), 4);
  for (const auto& [recipe, tp] : cases) {
    const std::string label = recipe->flavor() + " at tp " + std::to_string(tp);
    const auto mesh = dist::DeviceMesh::create(test_process_group(), 1, w / tp, tp);
    BuildOptions build;
    build.init.seed = 7;
    ZooModel whole = build_model(recipe, build);
    const std::string file = "/tmp/shardtrain-tp-weights-" + std::to_string(getpid()) + ".safetensors";
    save_weights(*whole.module, file, whole.names);

    ZooModel split_after = build_model(recipe, build);
    TensorParallel tp_after = tensor_parallelize(split_after, mesh.tp_group());
    parallelize(split_after, mesh, {});
    TensorParallelModel as_built = build_tensor_parallel(recipe, mesh, {}, {}, build);
    EXPECT_EQ(as_built.tp.describe(), tp_after.describe()) << label;
    EXPECT_EQ(as_built.tp.whole_parameters(), tp_after.whole_parameters()) << label;
    const auto after = fsdp::gather_full_parameters(split_after.module);
    const auto built = fsdp::gather_full_parameters(as_built.model.module);
    ASSERT_EQ(after.size(), built.size()) << label;
    for (const auto& [name, value] : after) {
      EXPECT_TRUE(at::equal(value, built.at(name))) << label << " as built: " << name;
    }

    for (bool from_rank0 : {false, true}) {
      BuildOptions other = build;
      other.init.seed = 8;  // different values, overwritten by the file's
      TensorParallelModel loaded = build_tensor_parallel(recipe, mesh, {}, {}, other);
      const auto layouts = loaded.tp.split_layouts(*loaded.model.module);
      load_weights_sharded(loaded.model.module, file, loaded.model.names,
                           from_rank0 ? std::optional(test_process_group().world()) : std::nullopt, {}, &loaded.tp);
      const auto values = fsdp::gather_full_parameters(loaded.model.module);
      for (const auto& p : whole.module->named_parameters()) {
        const at::Tensor expected = part_of(p.value(), layouts, p.key(), mesh.tp_group());
        EXPECT_TRUE(at::equal(values.at(p.key()), expected))
            << label << (from_rank0 ? ", rank 0 broadcasting: " : ", each rank reading: ") << p.key();
      }
    }
    std::remove(file.c_str());
  }
}

TEST(TensorParallel, RefusesWhatItCannotSplit) {
  const dist::Communicator& world = test_process_group().world();
  const int w = world.size();
  if (w == 1) GTEST_SKIP() << "every size divides by one rank";
  if (w == 3) {
    ZooModel model = build_model("llama-debug");
    testing::expect_error<std::invalid_argument>(
        [&] { tensor_parallelize(model, world); },
        {"tensor parallelism over 3 ranks", "do not divide by 3", "tensor-parallel sizes that divide them: 1, 2"});
  }
  if (w == 4) {  // 6 key/value heads: neither split by 4 ranks nor each held by whole ranks
    ZooModel model = build_model(recipe_of_model("llama-debug", {{"heads", 12}, {"kv_heads", 6}, {"head_dim", 16}}));
    testing::expect_error<std::invalid_argument>(
        [&] { tensor_parallelize(model, world); },
        {"the 6 key/value heads of layers.0.attn neither divide by 4 nor divide it",
         "tensor-parallel sizes that work: 1, 2, 3, 6, 12"});
    // Nothing was changed before the error.
    EXPECT_EQ(model.module->named_parameters()["layers.0.attn.q.weight"].size(0), 192);
  }
  if (w == 2) {
    ZooModel model = build_model(recipe_of_model("llama-debug", {{"kv_heads", 4}}));
    tensor_parallelize(model, world, {/*sequence_parallel=*/true});
    const at::Tensor ids = at::zeros({2, 5}, at::kLong);
    testing::expect_error<std::invalid_argument>(
        [&] { dynamic_cast<LlamaImpl&>(*model.module).run(ids, {}, ids, true); },
        {"sequence parallelism over 2 ranks", "5 tokens per sequence, which does not divide by 2"});
  }
  ZooModel vit = build_model("vit-debug");
  testing::expect_error<std::invalid_argument>([&] { tensor_parallelize(vit, world, {/*sequence_parallel=*/true}); },
                                               {"sequence parallelism of vit-debug", "no embedding that splits"});
  ZooModel flava = build_model("flava-debug");
  testing::expect_error<std::invalid_argument>([&] { tensor_parallelize(flava, world, {/*sequence_parallel=*/true}); },
                                               {"sequence parallelism of flava-debug", "no embedding that splits"});
}

}  // namespace
}  // namespace shardtrain::models
