// The model zoo under data parallelism, at every world size the binary runs at (1-4):
//  - FLAVA's global contrastive loss and its gradients equal one process on the concatenated batch;
//  - flava-debug trains under FULL_SHARD (FlavaLayer units) with the same losses and final parameters as one
//    process on the whole global batch, its data (masks, ITM negatives) a function of the seed and each sample's
//    global index only — also with activation checkpointing of every layer or every second layer;
//  - llama-debug, its embedding and head units of their own, trains under FULL_SHARD as one process does;
//  - build_parallel (each layer sharded as it is built) gives the model build_model + parallelize gives, with a
//    construction peak of about one layer beyond this rank's shards;
//  - a sharded model loads a Hugging Face safetensors file, each rank reading its rows or rank 0 reading and
//    broadcasting (sync_module_states), and a bad file fails on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <torch/torch.h>
#include <unistd.h>

#include "test_env.h"
#include "parity_helpers.h"
#include "shardtrain/io/files.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/io/safetensors.h"
#include "shardtrain/models/contrastive.h"
#include "shardtrain/models/flava.h"
#include "shardtrain/models/float8.h"
#include "shardtrain/models/generation.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/lora.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "support/expect_error.h"

namespace shardtrain::models {
namespace {

using testing::local_rows;
using testing::test_process_group;

void expect_relative(double ours, double reference, double rel, const std::string& what) {
  EXPECT_LE(std::abs(ours - reference), rel * std::max(1.0, std::abs(reference))) << what << ": " << ours << " vs "
                                                                                 << reference;
}

double mean_over_ranks(const at::Tensor& scalar) {
  at::Tensor t = scalar.detach().to(at::kDouble).reshape({1}).clone();
  test_process_group().world().all_reduce(t, dist::ReduceOp::MEAN).wait();
  return t.item<double>();
}

TEST(ModelsDist, GlobalContrastiveMatchesOneProcess) {
  const int w = test_process_group().world_size();
  torch::manual_seed(3);
  const int64_t global = 12, dim = 8;
  at::Tensor images = torch::nn::functional::normalize(at::randn({global, dim}),
                                                       torch::nn::functional::NormalizeFuncOptions().dim(-1));
  at::Tensor texts = torch::nn::functional::normalize(at::randn({global, dim}),
                                                      torch::nn::functional::NormalizeFuncOptions().dim(-1));
  auto loss_of = [](const ContrastiveLogits& l) {
    return (at::cross_entropy_loss(l.per_image, l.labels) + at::cross_entropy_loss(l.per_text, l.labels)) / 2;
  };
  // Reference: one process, the whole batch.
  at::Tensor ref_i = images.clone().requires_grad_(), ref_t = texts.clone().requires_grad_();
  at::Tensor ref_scale = at::tensor(2.0).requires_grad_();
  at::Tensor ref_loss = loss_of(global_contrastive_logits(ref_i, ref_t, ref_scale, std::nullopt));
  ref_loss.backward();
  // This rank's rows, gathered from every rank; the gradient of each rank's loss reaches every rank's rows.
  at::Tensor my_i = local_rows(images).clone().requires_grad_(), my_t = local_rows(texts).clone().requires_grad_();
  at::Tensor my_scale = at::tensor(2.0).requires_grad_();
  const dist::Communicator& world = test_process_group().world();
  ContrastiveLogits logits = global_contrastive_logits(my_i, my_t, my_scale, world);
  EXPECT_EQ(logits.per_image.sizes(), (std::vector<int64_t>{global / w, global}));
  at::Tensor loss = loss_of(logits);
  loss.backward();
  expect_relative(mean_over_ranks(loss), ref_loss.item<double>(), 1e-6, "loss");
  // d(mean of rank losses) = (1 / W) d(sum): what data parallelism averages.
  EXPECT_TRUE(at::allclose(my_i.grad() / w, local_rows(ref_i.grad()), 1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(my_t.grad() / w, local_rows(ref_t.grad()), 1e-5, 1e-7));
  expect_relative(mean_over_ranks(my_scale.grad()), ref_scale.grad().item<double>(), 1e-5, "logit scale gradient");
}

// Sample i of the synthetic dataset: a function of (seed, i) alone. Every sample masks exactly 2 tokens and 4 of
// 16 patches; odd samples are ITM negatives whose image is sample (i + 5)'s, so every even-sized, even-aligned share
// of the batch holds the same number of matching pairs and masked positions (per-rank means average to the
// global mean).
constexpr int64_t kGlobalBatch = 24, kTokens = 8;

FlavaBatch global_batch(int step, bool text, bool image) {
  FlavaBatch b;
  std::vector<at::Tensor> ids, masked_ids, mlm, pixels, codebook, patches, itm;
  for (int64_t i = 0; i < kGlobalBatch; ++i) {
    auto sample = [&](int64_t index) {
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1000 * step + index);
      return std::make_pair(at::randn({3, 32, 32}, g), at::rand({3, 32, 32}, g));
    };
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(77 + 1000 * step + i);
    at::Tensor t = at::randint(5, 1000, {kTokens}, g, at::kLong);
    at::Tensor which = at::randperm(kTokens, g, at::kLong).narrow(0, 0, 2);
    at::Tensor labels = at::full({kTokens}, -100, at::kLong);
    labels.index_put_({which}, t.index({which}));
    ids.push_back(t);
    masked_ids.push_back(t.index_put({which}, at::scalar_tensor(3, at::kLong)));
    mlm.push_back(labels);
    const bool negative = i % 2 == 1;
    auto [pix, cb] = sample(negative ? (i + 5) % kGlobalBatch : i);
    pixels.push_back(pix);
    codebook.push_back(cb);
    at::Tensor p = at::zeros({16}, at::kBool);
    p.index_put_({at::randperm(16, g, at::kLong).narrow(0, 0, 4)}, true);
    patches.push_back(p);
    itm.push_back(at::scalar_tensor(negative ? 0 : 1, at::kLong));
  }
  if (text) {
    b.input_ids = at::stack(ids), b.input_ids_masked = at::stack(masked_ids), b.mlm_labels = at::stack(mlm);
    b.attention_mask = at::ones({kGlobalBatch, kTokens}, at::kLong);
  }
  if (image) b.pixels = at::stack(pixels), b.codebook_pixels = at::stack(codebook), b.masked_patches = at::stack(patches);
  if (text && image) b.itm_labels = at::stack(itm);
  return b;
}

FlavaBatch local_batch(const FlavaBatch& b) {
  auto rows = [](const at::Tensor& t) { return t.defined() ? local_rows(t) : t; };
  return {rows(b.input_ids),   rows(b.input_ids_masked), rows(b.attention_mask), rows(b.pixels),    rows(b.codebook_pixels),
          rows(b.masked_patches), rows(b.mlm_labels),    rows(b.mim_labels),     rows(b.itm_labels)};
}

// Step s: image-text, text-only, image-only, image-text again.
FlavaBatch batch_for_step(int s) { return global_batch(s, s != 2, s != 1); }

TEST(ModelsDist, FlavaFullShardTrainsLikeOneProcess) {
  constexpr int kSteps = 4;
  BuildOptions build;
  build.init.seed = 11;
  std::vector<double> ref_losses;
  Flava reference(flava_flavor("flava-debug"), build);
  {
    torch::optim::AdamW adam(reference->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int s = 0; s < kSteps; ++s) {
      adam.zero_grad();
      at::Tensor loss = reference->run(batch_for_step(s)).loss;
      loss.backward();
      adam.step();
      ref_losses.push_back(loss.item<double>());
    }
  }
  // Plain units, and units whose layers are checkpointed (every layer, built then parallelized; every second
  // layer, checkpointed and sharded as built): the same training.
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  for (int64_t every : {0, 1, 2}) {
    const std::string label = "activation_checkpoint_every " + std::to_string(every);
    ParallelizeOptions options;
    options.activation_checkpoint_every = every;
    ZooModel model;
    std::vector<fsdp::FsdpUnit> units;
    if (every == 2) {
      model = build_parallel("flava-debug", mesh, options, build);
      units = fsdp::units_of(model.module);
    } else {
      model = build_model("flava-debug", build);
      units = parallelize(model, mesh, options);
    }
    ASSERT_EQ(units.size(), 2 * 2 + 1 + 1 + 1u)
        << "two text, two image, one multimodal FlavaLayer, the codebook, and the root";
    const auto codebook = std::find_if(units.begin(), units.end(), [](const fsdp::FsdpUnit& u) {
      return u.module_name() == "FlavaImageCodebook";
    });
    ASSERT_NE(codebook, units.end()) << "the frozen codebook is a unit of its own";
    std::vector<std::string> checkpointed;
    for (const auto& item : model.module->named_modules()) {
      if (nn::is_activation_checkpointed(*item.value())) checkpointed.push_back(item.key());
    }
    EXPECT_EQ(checkpointed.size(), every == 0 ? 0u : every == 1 ? 5u : 2u) << label;
    if (every == 2) {  // the same layers as activation_checkpoint_layers picks on a whole model
      ZooModel plain = build_model("flava-debug", build);
      EXPECT_EQ(activation_checkpoint_layers(plain, 2), checkpointed);
    }
    auto* flava = dynamic_cast<FlavaImpl*>(model.module.get());
    torch::optim::AdamW adam(model.module->parameters(), torch::optim::AdamWOptions(1e-3));
    for (int s = 0; s < kSteps; ++s) {
      adam.zero_grad();
      at::Tensor loss = flava->run(local_batch(batch_for_step(s))).loss;
      const int64_t gathers_before_backward = fsdp::fsdp_stats(model.module).all_gathers;
      const int64_t reshards_before_backward = fsdp::fsdp_stats(model.module).reshards_between_calls;
      loss.backward();
      adam.step();
      expect_relative(mean_over_ranks(loss), ref_losses[s], 1e-5, label + ": loss at step " + std::to_string(s));
      if (s > 0 && every == 0 && test_process_group().world_size() > 1) {
        // Backward gathers the layers that ran only (steps 1-3: text, image, image-text): not the codebook, whose
        // forward ran without grad mode, nor, prefetched, a layer of the other modality. The image-text step runs
        // each encoder twice (unmasked, masked): its four encoder layers reshard between their two calls'
        // backwards and are gathered again ([Note: a unit called twice] in lib/core/src/fsdp/fsdp_unit.cpp).
        const int64_t layers_run[] = {5, 2, 2, 5 + 4}, reshards_between_calls[] = {0, 0, 0, 4};
        EXPECT_EQ(fsdp::fsdp_stats(model.module).all_gathers - gathers_before_backward, layers_run[s])
            << "step " << s;
        EXPECT_EQ(fsdp::fsdp_stats(model.module).reshards_between_calls - reshards_before_backward,
                  reshards_between_calls[s])
            << "step " << s;
      }
      // Gathered only while it computed the MIM targets (no backward follows a no-grad forward).
      EXPECT_EQ(codebook->state(), fsdp::ShardState::SHARDED) << label << " step " << s;
    }
    // Parameters to 1e-5 absolute (1% of one Adam step, lr 1e-3), except the attention key biases: softmax is
    // invariant to them, so their true gradient is zero and what they get is rounding noise, which Adam normalises
    // into steps of up to lr — noise that differs with the summation order of sharded and unsharded gradients
    // (measured: key biases up to 1.6e-4 apart at W = 2..4; every other parameter within 1e-5; all equal at W = 1).
    auto full = fsdp::gather_full_parameters(model.module);
    for (const auto& p : reference->named_parameters()) {
      ASSERT_TRUE(full.count(p.key())) << p.key();
      if (p.key().find("attn.k.bias") != std::string::npos) continue;
      EXPECT_LE((full.at(p.key()) - p.value()).abs().max().item<double>(), 1e-5) << label << " " << p.key();
    }
  }
  EXPECT_GT(ref_losses.front(), 0.0);
}

TEST(ModelsDist, LlamaEdgeUnitsTrainLikeOneProcess) {
  // Llama's embedding and LM head are units of their own (ModelRecipe::edge_unit_classes), so that the root does
  // not hold them gathered through the step: both sharded after every step, and the training the same as one
  // process on the whole batch, with and without checkpointed layers, parallelized or sharded as built. Llama
  // 3.2's shape (llama-3.2-debug: the head tied to the embedding, RoPE scaling) keeps its one table in the root, as
  // Qwen2's (qwen2-debug, with biases on q, k, v) and Qwen3's (qwen3-debug, with q_norm and k_norm); Mistral's
  // window (8) is shorter than these 16 positions.
  constexpr int kSteps = 3;
  for (const std::string flavor :
       {"llama-debug", "llama-3.2-debug", "qwen2-debug", "qwen3-debug", "mistral-debug"}) {
    BuildOptions build;
    build.init.seed = 7;
    const LlamaConfig config = llama_flavor(flavor);
    const bool tied = config.tie_word_embeddings;
    torch::manual_seed(3);
    const at::Tensor ids = torch::randint(config.vocab_size, {12, 16}, torch::kLong);  // 12 rows: W = 1..4 divide
    std::vector<double> ref_losses;
    Llama reference(config, build);
    {
      torch::optim::AdamW adam(reference->parameters(), torch::optim::AdamWOptions(1e-3));
      for (int s = 0; s < kSteps; ++s) {
        adam.zero_grad();
        at::Tensor loss = reference->run(ids, {}, ids, /*labelled_only=*/true).loss;
        loss.backward();
        adam.step();
        ref_losses.push_back(loss.item<double>());
      }
    }
    const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
    const at::Tensor local = local_rows(ids);
    for (int64_t every : {0, 1}) {
      for (bool as_built : {false, true}) {
        const std::string label =
            flavor + ", activation_checkpoint_every " + std::to_string(every) + (as_built ? ", as built" : "");
        ParallelizeOptions options;
        options.activation_checkpoint_every = every;
        ZooModel model;
        std::vector<fsdp::FsdpUnit> units;
        if (as_built) {
          model = build_parallel(flavor, mesh, options, build);
          units = fsdp::units_of(model.module);
        } else {
          model = build_model(flavor, build);
          units = parallelize(model, mesh, options);
        }
        ASSERT_EQ(units.size(), (tied ? 2 + 1u : 2 + 2 + 1u))
            << label << ": two decoder layers, the embedding and the head unless tied, the root";
        std::vector<fsdp::FsdpUnit> edges;
        for (const auto& u : units) {
          if (u.module_name() == "LlamaEmbedding" || u.module_name() == "LlamaLMHead") edges.push_back(u);
        }
        ASSERT_EQ(edges.size(), tied ? 0u : 2u) << label;
        auto* llama = dynamic_cast<LlamaImpl*>(model.module.get());
        torch::optim::AdamW adam(model.module->parameters(), torch::optim::AdamWOptions(1e-3));
        for (int s = 0; s < kSteps; ++s) {
          adam.zero_grad();
          at::Tensor loss = llama->run(local, {}, local, /*labelled_only=*/true).loss;
          loss.backward();
          adam.step();
          expect_relative(mean_over_ranks(loss), ref_losses[s], 1e-5, label + ": loss at step " + std::to_string(s));
          for (const auto& u : edges) {
            EXPECT_EQ(u.state(), fsdp::ShardState::SHARDED) << label << " " << u.module_name();
          }
        }
        // Qwen2's key biases aside: their true gradient is zero, rounding noise that Adam normalises (as above).
        // Qwen3's q/k norms leave more gradients near zero, where Adam's normalisation turns rounding into up to
        // 1.4e-5 at W = 3 (measured; with SGD instead, every parameter within 1.2e-7 of one process's): 3e-5.
        const double tolerance = config.qk_norm ? 3e-5 : 1e-5;
        auto full = fsdp::gather_full_parameters(model.module);
        EXPECT_EQ(full.size(), reference->named_parameters().size()) << label;
        for (const auto& p : reference->named_parameters()) {
          ASSERT_TRUE(full.count(p.key())) << p.key();
          if (p.key().find("attn.k.bias") != std::string::npos) continue;
          EXPECT_LE((full.at(p.key()) - p.value()).abs().max().item<double>(), tolerance) << label << " " << p.key();
        }
      }
    }
  }
}

// FSDP's float8 all-gather (FsdpOptions::float8_all_gather): llama-debug's projections in float8 (tensorwise), the
// layers' weights gathered in e4m3 with one scale each, train exactly as gathering in bf16 and casting after does —
// the same losses and parameters, bit for bit, over 3 AdamW steps, under FULL_SHARD and SHARD_GRAD_OP, with and
// without checkpointed layers — while the gathers bring in fewer bytes and hold fewer (the projections one byte an
// element against bf16's two).
TEST(ModelsDist, Float8AllGatherIsTheCastOfTheGatheredWeight) {
  constexpr int kSteps = 3;
  const std::string flavor = "llama-debug";
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  torch::manual_seed(3);
  const at::Tensor ids = torch::randint(llama_flavor(flavor).vocab_size, {12, 16}, torch::kLong);
  const at::Tensor local = local_rows(ids);
  struct Run {
    std::vector<double> losses;
    std::map<std::string, at::Tensor> params;
    fsdp::FsdpStats stats;
    int64_t float8_numel = 0;  // the float8 projections' weights, whole
  };
  for (parallel::Strategy strategy : {parallel::Strategy::FULL_SHARD, parallel::Strategy::SHARD_GRAD_OP}) {
    for (int64_t every : {0, 1}) {
      const std::string label =
          parallel::to_string(strategy) + ", activation_checkpoint_every " + std::to_string(every);
      auto train = [&](bool float8_gather) {
        BuildOptions build;
        build.init.seed = 7;
        Float8Layers float8(parallel::Float8Recipe::TENSORWISE, {});
        build.on_layer = [&](const std::string& name, const std::shared_ptr<torch::nn::Module>& layer) {
          float8.convert(name, *layer);
        };
        ParallelizeOptions options;
        options.strategy = strategy;
        options.activation_checkpoint_every = every;
        options.fsdp.mixed_precision.param_dtype = at::kBFloat16;
        options.fsdp.float8_all_gather = float8_gather;
        ZooModel model = build_parallel(flavor, mesh, options, build);
        EXPECT_GT(float8.converted(), 0) << label;
        auto* llama = dynamic_cast<LlamaImpl*>(model.module.get());
        torch::optim::AdamW adam(model.module->parameters(), torch::optim::AdamWOptions(1e-3));
        Run run;
        for (int s = 0; s < kSteps; ++s) {
          adam.zero_grad();
          at::Tensor loss = llama->run(local, {}, local, /*labelled_only=*/true).loss;
          loss.backward();
          adam.step();
          run.losses.push_back(loss.item<double>());
        }
        run.stats = fsdp::fsdp_stats(model.module);
        run.params = fsdp::gather_full_parameters(model.module);
        for (const auto& item : model.module->named_modules()) {
          const auto* linear = dynamic_cast<const LinearImpl*>(item.value().get());
          if (linear && linear->float8) run.float8_numel += run.params.at(item.key() + ".weight").numel();
        }
        return run;
      };
      const Run cast_after = train(false), gathered = train(true);
      EXPECT_EQ(gathered.losses, cast_after.losses) << label;
      ASSERT_EQ(gathered.params.size(), cast_after.params.size()) << label;
      for (const auto& [name, value] : cast_after.params) {
        EXPECT_TRUE(at::equal(gathered.params.at(name), value)) << label << " " << name;
      }
      EXPECT_EQ(gathered.stats.all_gathers, cast_after.stats.all_gathers) << label;
      // Each gather of the layers (twice a step resharding after forward, else once) brings in the projections at
      // one byte an element instead of two; the norms, embedding, head and root as before. Within 5%: rows padded
      // to the world size, slots aligned to 16 bytes.
      const double rounds = kSteps * (strategy == parallel::Strategy::FULL_SHARD ? 2 : 1);
      const double saved = static_cast<double>(cast_after.stats.all_gather_bytes - gathered.stats.all_gather_bytes);
      EXPECT_NEAR(saved, rounds * static_cast<double>(gathered.float8_numel),
                  0.05 * rounds * static_cast<double>(gathered.float8_numel)) << label;
      EXPECT_LT(gathered.stats.peak_unsharded_bytes, cast_after.stats.peak_unsharded_bytes) << label;
      if (test_process_group().rank() == 0) {
        std::printf("float8 all-gather, %s: %.3f of bf16's bytes gathered, peak unsharded %lld against %lld\n",
                    label.c_str(), static_cast<double>(gathered.stats.all_gather_bytes) /
                                       static_cast<double>(cast_after.stats.all_gather_bytes),
                    static_cast<long long>(gathered.stats.peak_unsharded_bytes),
                    static_cast<long long>(cast_after.stats.peak_unsharded_bytes));
      }
    }
  }
}

// `recipe`'s model as a case of a grid runs it: FSDP with `strategy` and activation checkpointing every `every`
// layers, parallelized after it is built or (as_built) sharded layer by layer while it is built; or DDP.
struct Distributed {
  ZooModel model;
  std::optional<ddp::Ddp> ddp;

  // Every parameter whole (gathered from the shards under FSDP), by name.
  std::map<std::string, at::Tensor> full_parameters() const {
    if (!ddp) return fsdp::gather_full_parameters(model.module);
    std::map<std::string, at::Tensor> out;
    for (const auto& p : model.module->named_parameters()) out[p.key()] = p.value().detach();
    return out;
  }
};
Distributed distribute(const std::shared_ptr<const ModelRecipe>& recipe, const dist::DeviceMesh& mesh,
                       parallel::Strategy strategy, int64_t every, bool as_built, bool use_ddp,
                       const BuildOptions& build) {
  ParallelizeOptions options;
  options.strategy = strategy;
  options.activation_checkpoint_every = every;
  Distributed d;
  d.model = as_built && !use_ddp ? build_parallel(recipe, mesh, options, build) : build_model(recipe, build);
  if (use_ddp) {
    d.ddp = replicate_model(d.model, mesh);
  } else if (!as_built) {
    parallelize(d.model, mesh, options);
  }
  return d;
}

// LoRA (models/lora.h) under FSDP and DDP: adapters on frozen layers train as one process trains them. A layer's
// unit then holds frozen weights that backward reads after its adapters' gradients are complete ([Note: frozen
// parameters] in lib/core/src/fsdp/fsdp_unit.cpp), and units of frozen parameters alone (Llama's embedding and head, FLAVA's
// root) take part in backward without reducing anything. FLAVA runs its encoder layers twice per step. Dropout 0:
// a run's masks would differ with the world size.
TEST(ModelsDist, LoraAdaptersTrainLikeOneProcess) {
  constexpr int kSteps = 3;
  struct Case {
    std::string flavor;
    std::vector<std::string> targets;
    parallel::Strategy strategy;
    int64_t every;
    bool as_built, ddp;
  };
  const auto full = parallel::Strategy::FULL_SHARD;
  const std::vector<Case> cases = {
      {"llama-debug", {}, full, 0, false, false},
      {"llama-debug", {}, full, 1, true, false},
      {"llama-debug", {"all-linear"}, parallel::Strategy::SHARD_GRAD_OP, 0, false, false},
      {"llama-debug", {"all-linear"}, full, 0, true, true},
      {"flava-debug", {}, full, 0, false, false},
      {"flava-debug", {"query", "value", "output.dense"}, full, 1, true, false},
  };
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  for (const Case& c : cases) {
    LoraSpec spec;
    spec.r = 4, spec.lora_alpha = 8, spec.target_modules = c.targets;
    const auto recipe = with_lora(recipe_of(c.flavor), spec);
    const std::string label = c.flavor + " targets " + (c.targets.empty() ? "default" : c.targets.front()) +
                              (c.ddp ? ", DDP" : c.strategy == full ? ", FULL_SHARD" : ", SHARD_GRAD_OP") +
                              ", checkpoint every " + std::to_string(c.every) + (c.as_built ? ", as built" : "");
    BuildOptions build;
    build.init.seed = 5;
    const bool llama = c.flavor == "llama-debug";
    torch::manual_seed(3);
    const at::Tensor ids = torch::randint(llama_flavor("llama-debug").vocab_size, {12, 16}, torch::kLong);
    auto loss_of = [&](torch::nn::Module& m, bool local, int s) {
      if (llama) {
        const at::Tensor x = local ? local_rows(ids) : ids;
        return dynamic_cast<LlamaImpl&>(m).run(x, {}, x, /*labelled_only=*/true).loss;
      }
      return dynamic_cast<FlavaImpl&>(m).run(local ? local_batch(batch_for_step(s)) : batch_for_step(s)).loss;
    };
    auto trainable = [](torch::nn::Module& m) {
      std::vector<at::Tensor> out;
      for (const auto& p : m.parameters()) {
        if (p.requires_grad()) out.push_back(p);
      }
      return out;
    };
    ZooModel reference = build_model(recipe, build);
    std::map<std::string, at::Tensor> initial;
    for (const auto& p : reference.module->named_parameters()) initial[p.key()] = p.value().detach().clone();
    std::vector<double> ref_losses;
    int64_t adapters = 0;
    for (const auto& p : reference.module->named_parameters()) {
      if (p.key().find(".lora_") != std::string::npos) ++adapters;
      EXPECT_EQ(p.value().requires_grad(), p.key().find(".lora_") != std::string::npos) << label << " " << p.key();
    }
    EXPECT_GT(adapters, 0) << label;
    {
      torch::optim::AdamW adam(trainable(*reference.module), torch::optim::AdamWOptions(1e-3));
      for (int s = 0; s < kSteps; ++s) {
        adam.zero_grad();
        at::Tensor loss = loss_of(*reference.module, false, s);
        loss.backward();
        adam.step();
        ref_losses.push_back(loss.item<double>());
      }
    }
    const Distributed distributed = distribute(recipe, mesh, c.strategy, c.every, c.as_built, c.ddp, build);
    torch::nn::Module& model = *distributed.model.module;
    torch::optim::AdamW adam(trainable(model), torch::optim::AdamWOptions(1e-3));
    for (int s = 0; s < kSteps; ++s) {
      adam.zero_grad();
      at::Tensor loss = loss_of(model, true, s);
      loss.backward();
      adam.step();
      expect_relative(mean_over_ranks(loss), ref_losses[s], 1e-5, label + ": loss at step " + std::to_string(s));
    }
    const auto params = distributed.full_parameters();
    for (const auto& p : reference.module->named_parameters()) {
      ASSERT_TRUE(params.count(p.key())) << label << " " << p.key();
      if (p.key().find("attn.k.bias") != std::string::npos) continue;  // rounding noise Adam scales (see above)
      EXPECT_LE((params.at(p.key()) - p.value()).abs().max().item<double>(), 1e-5) << label << " " << p.key();
      if (!p.value().requires_grad()) {  // frozen: as initialised, bit for bit
        EXPECT_TRUE(at::equal(params.at(p.key()), initial.at(p.key()))) << label << " " << p.key();
      } else {
        EXPECT_FALSE(at::equal(p.value(), initial.at(p.key()))) << label << " " << p.key() << " trained";
      }
    }
  }
}

// GPT-2 under FSDP and DDP trains as one process: its Conv1D weights, stored (in, out), shard along their input
// dimension; c_attn's one product makes q, k and v; the tied table stays in the root. With LoRA, PEFT's default
// target for GPT-2 (c_attn) adapts the fused projection. In eval mode: dropout's masks would differ with the world
// size (gpt2-debug keeps GPT-2's dropout of 0.1).
TEST(ModelsDist, Gpt2TrainsLikeOneProcess) {
  constexpr int kSteps = 3;
  struct Case {
    int64_t lora_r;
    parallel::Strategy strategy;
    int64_t every;
    bool as_built, ddp;
  };
  const auto full = parallel::Strategy::FULL_SHARD;
  const std::vector<Case> cases = {{0, full, 0, false, false},
                                   {0, full, 1, true, false},
                                   {0, parallel::Strategy::SHARD_GRAD_OP, 0, false, false},
                                   {0, full, 0, false, true},
                                   {4, full, 1, false, false}};
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  torch::manual_seed(3);
  const at::Tensor ids = torch::randint(gpt2_flavor("gpt2-debug").vocab_size, {12, 16}, torch::kLong);
  for (const Case& c : cases) {
    LoraSpec spec;
    spec.r = c.lora_r, spec.lora_alpha = 8;
    const auto recipe = with_lora(recipe_of("gpt2-debug"), spec);
    const std::string label = std::string(c.lora_r > 0 ? "LoRA on c_attn, " : "") +
                              (c.ddp ? "DDP" : c.strategy == full ? "FULL_SHARD" : "SHARD_GRAD_OP") +
                              ", checkpoint every " + std::to_string(c.every) + (c.as_built ? ", as built" : "");
    BuildOptions build;
    build.init.seed = 5;
    auto train = [&](ZooModel& m, const at::Tensor& x, std::vector<double>& losses, bool reduce) {
      m.module->eval();
      std::vector<at::Tensor> trainable;
      for (const auto& p : m.module->parameters()) {
        if (p.requires_grad()) trainable.push_back(p);
      }
      torch::optim::AdamW adam(trainable, torch::optim::AdamWOptions(1e-3));
      for (int s = 0; s < kSteps; ++s) {
        adam.zero_grad();
        at::Tensor loss = dynamic_cast<Gpt2Impl&>(*m.module).run(x, {}, x, /*labelled_only=*/true).loss;
        loss.backward();
        adam.step();
        losses.push_back(reduce ? mean_over_ranks(loss) : loss.item<double>());
      }
    };
    ZooModel reference = build_model(recipe, build);
    EXPECT_EQ(reference.module->named_parameters()["layers.0.attn.qkv.weight"].sizes(), (at::IntArrayRef{64, 192}));
    if (c.lora_r > 0) {
      EXPECT_TRUE(reference.module->named_parameters().contains("layers.1.attn.qkv.lora_B.weight")) << label;
    }
    std::vector<double> ref_losses, losses;
    train(reference, ids, ref_losses, false);
    Distributed distributed = distribute(recipe, mesh, c.strategy, c.every, c.as_built, c.ddp, build);
    train(distributed.model, local_rows(ids), losses, true);
    for (int s = 0; s < kSteps; ++s) {
      expect_relative(losses[s], ref_losses[s], 1e-5, label + ": loss at step " + std::to_string(s));
    }
    const auto params = distributed.full_parameters();
    for (const auto& p : reference.module->named_parameters()) {
      ASSERT_TRUE(params.count(p.key())) << label << " " << p.key();
      at::Tensor diff = (params.at(p.key()) - p.value()).abs();
      // The key bias's true gradient is zero (softmax ignores a shift), rounding noise Adam scales: c_attn's bias
      // is compared on its query and value thirds.
      if (p.key().find("attn.qkv.bias") != std::string::npos) {
        diff = at::cat({diff.narrow(0, 0, 64), diff.narrow(0, 128, 64)});
      }
      EXPECT_LE(diff.max().item<double>(), 1e-5) << label << " " << p.key();
    }
  }
}

// Causal LMs as sequence classifiers (score on each row's last token) train as one process on the whole batch, rows
// of different lengths right-padded: Llama (its embedding a unit of its own), Qwen2 (tied as an LM, so its
// classifier's embedding leaves the root) and GPT-2 (the table a lookup's alone, in the root), under FULL_SHARD with
// and without checkpointing, sharded as built, SHARD_GRAD_OP and DDP.
TEST(ModelsDist, CausalLmClassifiersTrainLikeOneProcess) {
  constexpr int kSteps = 3;
  struct Case {
    parallel::Strategy strategy;
    int64_t every;
    bool as_built, ddp;
  };
  const auto full = parallel::Strategy::FULL_SHARD;
  const std::vector<Case> cases = {{full, 0, false, false},
                                   {full, 1, true, false},
                                   {parallel::Strategy::SHARD_GRAD_OP, 0, false, false},
                                   {full, 0, false, true}};
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  torch::manual_seed(3);
  const at::Tensor ids = torch::randint(3, 1000, {12, 16}, torch::kLong);
  at::Tensor mask = at::ones_like(ids);
  for (int64_t r = 0; r < 12; ++r) mask[r].narrow(0, 16 - r, r).zero_();  // row r: 16 - r tokens
  const at::Tensor labels = torch::randint(3, {12}, torch::kLong);
  for (const std::string flavor : {"llama-debug", "qwen2-debug", "gpt2-debug"}) {
    const auto recipe =
        recipe_for_task(recipe_of(flavor), "classify", {{"a", "b", "c"}, false, std::nullopt, std::nullopt});
    BuildOptions build;
    build.init.seed = 5;
    auto train = [&](ZooModel& m, const at::Tensor& x, const at::Tensor& attention, const at::Tensor& y,
                     std::vector<double>& losses, bool reduce) {
      m.module->eval();  // GPT-2's dropout off
      // SGD: most of a classifier's gradients, reaching the layers through one token a row, are near zero, where
      // AdamW's normalisation turns the summation order's rounding into steps of up to lr (2.8e-5 apart at W = 3).
      torch::optim::SGD sgd(m.module->parameters(), torch::optim::SGDOptions(0.1));
      for (int s = 0; s < kSteps; ++s) {
        sgd.zero_grad();
        data::Batch b;
        b.kind = data::SampleKind::TEXT, b.input_ids = x, b.attention_mask = attention, b.labels = y;
        at::Tensor loss = recipe->task()->compute_losses(*m.module, b, 0).total;
        loss.backward();
        sgd.step();
        losses.push_back(reduce ? mean_over_ranks(loss) : loss.item<double>());
      }
    };
    ZooModel reference = build_model(recipe, build);
    std::vector<double> ref_losses;
    train(reference, ids, mask, labels, ref_losses, false);
    for (const Case& c : cases) {
      const std::string label = flavor + ", " + (c.ddp ? "DDP" : c.strategy == full ? "FULL_SHARD" : "SHARD_GRAD_OP") +
                                ", checkpoint every " + std::to_string(c.every) + (c.as_built ? ", as built" : "");
      Distributed distributed = distribute(recipe, mesh, c.strategy, c.every, c.as_built, c.ddp, build);
      std::vector<double> losses;
      train(distributed.model, local_rows(ids), local_rows(mask), local_rows(labels), losses, true);
      for (int s = 0; s < kSteps; ++s) {
        expect_relative(losses[s], ref_losses[s], 1e-5, label + ": loss at step " + std::to_string(s));
      }
      const auto params = distributed.full_parameters();
      EXPECT_TRUE(params.count("score.weight")) << label;
      for (const auto& p : reference.module->named_parameters()) {
        ASSERT_TRUE(params.count(p.key())) << label << " " << p.key();
        EXPECT_LE((params.at(p.key()) - p.value()).abs().max().item<double>(), 1e-6) << label << " " << p.key();
      }
    }
  }
}

// Generation (models/generation.h) from a sharded model: every rank decodes the same prompts, each step a forward
// through the root (T5's encoder pass and cached decoding steps included), so the units gather on every rank
// together, and the ranks, computing the same tokens, stop on the same step. The tokens are one process's, and so
// is every greedy step's logits within float32 rounding (random T5 repeats a token: the logits say more); with
// layers checkpointed too (a no-op without gradients).
TEST(ModelsDist, ShardedModelsGenerateAsOneProcess) {
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  at::NoGradGuard no_grad;
  for (const std::string flavor : {"t5-debug", "llama-debug", "gpt2-debug"}) {
    for (const int64_t every : {0, 1}) {
      SCOPED_TRACE(flavor + ", checkpoint every " + std::to_string(every));
      const auto recipe = recipe_of(flavor);
      BuildOptions build;
      build.init.seed = 9;
      torch::manual_seed(4);
      const at::Tensor prompts = torch::randint(3, 100, {3, 7}, torch::kLong);
      at::Tensor mask = at::ones_like(prompts);
      mask[1].narrow(0, 0, 2).zero_();  // left padding
      GenerationOptions options;
      options.max_new_tokens = 9;
      options.eos_token_ids = {5};
      // generate()'s tokens, and the logits (steps, B, vocab) of as many greedy steps through a decoder of their own
      auto tokens_of = [&](ZooModel& m, at::Tensor& step_logits) {
        m.module->eval();
        {
          const auto decoder = m.recipe->text_decoder(*m.module);
          std::vector<at::Tensor> steps{decoder->start(prompts, mask)};
          for (int64_t s = 1; s < options.max_new_tokens; ++s) steps.push_back(decoder->next(steps.back().argmax(-1)));
          step_logits = at::stack(steps);
        }
        return generate(*m.recipe->text_decoder(*m.module), prompts, mask, options).tokens;
      };
      ZooModel reference = build_model(recipe, build);
      at::Tensor ref_logits, logits;
      const at::Tensor expected = tokens_of(reference, ref_logits);
      Distributed sharded = distribute(recipe, mesh, parallel::Strategy::FULL_SHARD, every, false, false, build);
      const at::Tensor got = tokens_of(sharded.model, logits);
      EXPECT_TRUE(at::equal(got, expected)) << got << "\n" << expected;
      EXPECT_TRUE(at::allclose(logits, ref_logits, 1e-4, 1e-5)) << (logits - ref_logits).abs().max();
    }
  }
}

// Data-parallel generation from a sharded model (GenerationOptions::synced, transformers' synced_gpus): each rank
// its own prompts, batch sizes and lengths, ending at a step of its own (rank 0's rows at the third, on an
// end-of-sequence token picked from its own greedy tokens; the others run longer). Each rank's tokens are what one
// process makes of its prompts, padding after; without synced the ranks would call different numbers of steps,
// and the gathers of a rank that stopped would be missing (a hang until the timeout).
TEST(ModelsDist, ShardedModelsGenerateTheirOwnPromptsInStep) {
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  const int rank = mesh.world().rank();
  at::NoGradGuard no_grad;
  for (const std::string flavor : {"llama-debug", "t5-debug"}) {
    SCOPED_TRACE(flavor);
    const auto recipe = recipe_of(flavor);
    BuildOptions build;
    build.init.seed = 9;
    auto prompts_of = [](int r) {
      torch::manual_seed(40 + r);
      const at::Tensor ids = torch::randint(3, 100, {1 + r % 2, 4 + r}, torch::kLong);
      return std::pair(ids, at::ones_like(ids));
    };
    GenerationOptions options;
    options.max_new_tokens = 10;
    ZooModel reference = build_model(recipe, build);
    reference.module->eval();
    auto one_process = [&](const std::pair<at::Tensor, at::Tensor>& p) {
      return generate(*reference.recipe->text_decoder(*reference.module), p.first, p.second, options);
    };
    options.eos_token_ids = {one_process(prompts_of(0)).tokens[0][2].item<int64_t>()};
    options.pad_token_id = 1;
    const auto mine = prompts_of(rank);
    const Generated expected = one_process(mine);
    const int64_t n = expected.tokens.size(1);
    // The premise: the ranks end at different steps (rank 0 at the third at the latest, some other rank later).
    at::Tensor ends = at::full({2}, static_cast<float>(n));
    ends[1] = -static_cast<float>(n);
    mesh.world().all_reduce(ends, dist::ReduceOp::MAX).wait();
    const auto longest = static_cast<int64_t>(ends[0].item<float>());
    const auto shortest = -static_cast<int64_t>(ends[1].item<float>());
    if (rank == 0) ASSERT_LE(n, 3);
    if (mesh.world().size() > 1) ASSERT_LT(shortest, longest);

    Distributed sharded = distribute(recipe, mesh, parallel::Strategy::FULL_SHARD, 0, false, false, build);
    sharded.model.module->eval();
    options.synced = mesh.world();
    int64_t steps = 0;
    const Generated got = generate(*sharded.model.recipe->text_decoder(*sharded.model.module), mine.first,
                                   mine.second, options, [&](int64_t made) { steps = made; });
    EXPECT_EQ(got.lengths, expected.lengths);
    ASSERT_GE(got.tokens.size(1), n);
    EXPECT_TRUE(at::equal(got.tokens.narrow(1, 0, n), expected.tokens)) << got.tokens << "\n" << expected.tokens;
    EXPECT_TRUE(got.tokens.narrow(1, n, got.tokens.size(1) - n).eq(options.pad_token_id).all().item<bool>());
    EXPECT_EQ(steps, longest);  // every rank stepped as long as the longest
  }
}

// A FLAVA large enough that its layers dominate: 20 layers of 0.8M parameters, small embeddings and codebook.
FlavaConfig wide_flava() {
  FlavaConfig c = flava_flavor("flava-debug");
  c.dim = 256, c.mlp_dim = 1024, c.heads = 8, c.unimodal_layers = 8, c.multimodal_layers = 4;
  return c;
}

TEST(ModelsDist, BuildParallelShardsLayersAsTheyAreBuilt) {
  memory::install_cpu_memory_counter();
  const int w = test_process_group().world_size();
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  BuildOptions build;
  build.init.seed = 5;

  // Same model either way (weights are a function of seed and names).
  ZooModel a = build_parallel("flava-debug", mesh, ParallelizeOptions{}, build);
  ZooModel b = build_model("flava-debug", build);
  parallelize(b, mesh, ParallelizeOptions{});
  auto pa = fsdp::gather_full_parameters(a.module), pb = fsdp::gather_full_parameters(b.module);
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& [name, t] : pa) EXPECT_TRUE(at::equal(t, pb.at(name))) << name;
  testing::expect_error<std::invalid_argument>(
      [&] {
        ParallelizeOptions o;
        o.layer_classes = {"BertLayer"};
        build_parallel("flava-debug", mesh, o, build);
      },
      {"'BertLayer'", "'FlavaLayer'"});

  // Construction peak: this rank's shards plus about one unsharded layer (and the root's own parameters).
  const FlavaConfig c = wide_flava();
  const int64_t layer_bytes = 4 * (4 * c.dim * c.dim + 2 * c.dim * c.mlp_dim);
  const int64_t layers_bytes = layer_bytes * (2 * c.unimodal_layers + c.multimodal_layers);
  BuildOptions meta;
  meta.tensors = meta.tensors.device(torch::kMeta);
  const int64_t root_bytes = 4 * count_parameters(*Flava(c, meta)) - layers_bytes;
  memory::reset_cpu_peak();
  const int64_t before = memory::cpu_memory_stats().current_bytes;
  BuildOptions wide = build;
  wide.on_layer = [&](const std::string&, const std::shared_ptr<torch::nn::Module>& layer) {
    fsdp::fully_shard(layer, mesh.world());
  };
  Flava model(c, wide);
  const int64_t peak = memory::cpu_memory_stats().peak_bytes - before;
  EXPECT_LE(peak, layers_bytes / w + 2 * layer_bytes + root_bytes)
      << "peak " << peak << " B, layers " << layers_bytes << " B, one layer " << layer_bytes << " B, root " << root_bytes;
}

TEST(ModelsDist, ShardedModelLoadsHuggingFaceWeights) {
  const dist::Communicator& world = test_process_group().world();
  const auto mesh = dist::DeviceMesh::create(test_process_group(), 1);
  // One file name for every rank of this launch (the workers share the launcher as parent).
  const std::string dir = "/tmp/shardtrain-test-" + std::to_string(::getppid()) + "-weights";
  for (const std::string flavor : {"flava-debug", "bert-debug", "t5-debug"}) {
    SCOPED_TRACE(flavor);
    BuildOptions source_build;
    source_build.init.seed = 21;
    ZooModel source = build_model(flavor, source_build);
    const std::string path = dir + "/" + flavor + ".safetensors";
    if (world.rank() == 0) {
      io::make_directories(dir);
      save_weights(*source.module, path, source.names);
    }
    world.barrier().wait();
    for (bool from_rank0 : {false, true}) {
      SCOPED_TRACE(from_rank0 ? "rank 0 reads and broadcasts" : "every rank reads its rows");
      BuildOptions other;
      other.init.seed = 99;  // other weights until loaded
      ZooModel model = build_parallel(flavor, mesh, ParallelizeOptions{}, other);
      // With from_rank0 the other ranks are given a path that does not exist: they never open it.
      const std::string given = from_rank0 && world.rank() != 0 ? path + ".absent" : path;
      load_weights_sharded(model.module, given, model.names, from_rank0 ? std::optional(world) : std::nullopt);
      const auto full = fsdp::gather_full_parameters(model.module);
      for (const auto& p : source.module->named_parameters()) {
        ASSERT_TRUE(full.count(p.key())) << p.key();
        EXPECT_TRUE(at::equal(full.at(p.key()), p.value())) << p.key();
      }
      auto buffers = model.module->named_buffers();
      for (const auto& b : source.module->named_buffers()) EXPECT_TRUE(at::equal(buffers[b.key()], b.value())) << b.key();
    }
  }
  // A file whose tensor has the wrong shape: every rank fails, rank 0 naming the tensor; with from_rank0 the
  // others say rank 0 failed.
  ZooModel small = build_model("bert-debug");
  const std::string bad = dir + "/bad.safetensors";
  if (world.rank() == 0) {
    auto tensors = hf_named_tensors(*small.module, small.names);
    for (auto& [name, t] : tensors) {
      if (name.find("word_embeddings") != std::string::npos) t = t.narrow(0, 0, t.size(0) - 1);
    }
    io::write_safetensors(bad, tensors);
  }
  world.barrier().wait();
  for (bool from_rank0 : {false, true}) {
    ZooModel model = build_parallel("bert-debug", mesh, ParallelizeOptions{});
    const std::string message = testing::expect_error<std::runtime_error>(
        [&] { load_weights_sharded(model.module, bad, model.names, from_rank0 ? std::optional(world) : std::nullopt); },
        {bad});
    const bool names_tensor = message.find("word_embeddings") != std::string::npos;
    EXPECT_TRUE(names_tensor || (from_rank0 && world.rank() != 0 && message.find("rank 0") != std::string::npos))
        << message;
  }
  world.barrier().wait();
  if (world.rank() == 0) io::remove_tree(dir);
}

}  // namespace
}  // namespace shardtrain::models
