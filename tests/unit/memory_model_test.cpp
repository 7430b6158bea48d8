// The memory model against measurement: real training steps (forward, loss, backward, AdamW, zero_grad) of BERT
// and Llama models of a few million parameters on CPU, each phase's peak counted by the project's allocator,
// against plan::estimate_training_memory at world size 1. The full grid (strategies, world sizes, AC, precisions)
// is bench/memory_model_bench; this is the subset a test can afford.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/fsdp/wrap_policy.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/synthetic_batch.h"
#include "shardtrain/nn/activation_checkpoint.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/plan/memory_model.h"
#include "nn/autocast_guard.h"
#include "support/expect_error.h"

namespace shardtrain::plan {
namespace {

std::shared_ptr<const models::ModelRecipe> recipe_from_json(const std::string& name, const std::string& json) {
  // Each process its own directory: ctest runs these tests side by side.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("shardtrain_memory_model_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << json;
  return models::recipe_from_hf_config(dir.string());
}

struct Measured {
  int64_t forward = 0, backward = 0, step = 0;
  int64_t peak() const { return std::max({forward, backward, step}); }
};

// Three steps of `micro_batches` forwards and backwards each; the third is measured (AdamW's state exists from the
// first), each phase's peak over its micro-batches. With `autocast`, forward runs under bfloat16 autocast, as
// DDP's mixed precision runs it (train/parallel_model.cpp).
Measured measure(const models::ModelRecipe& recipe, int64_t batch, int64_t tokens, bool text_labels,
                 int64_t micro_batches, bool autocast, bool synthetic = false, bool checkpoint = false) {
  memory::install_cpu_memory_counter();
  models::BuildOptions build;
  build.init.seed = 1;
  auto model = recipe.build(build);
  model->train();
  if (checkpoint) {  // every layer, as activation_checkpointing: true does
    nn::apply_activation_checkpointing(model, [&](const std::string&, torch::nn::Module& m) {
      return fsdp::module_class_name(m) == recipe.layer_class();
    });
  }
  const auto task = recipe.task();
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(1e-4));
  data::Batch b;
  if (synthetic) {
    b = models::synthetic_batch(task->data_needs(), batch, tokens, 1);
  } else {
    b.kind = data::SampleKind::TEXT;
    b.input_ids = at::randint(5, 900, {batch, tokens}, at::kLong);
    b.attention_mask = at::ones({batch, tokens}, at::kLong);
    b.input_ids_masked = b.input_ids.clone();
    b.mlm_labels = at::full({batch, tokens}, -100, at::kLong);
    if (text_labels) {
      b.mlm_labels.index_put_({at::indexing::Slice(), at::indexing::Slice(0, at::indexing::None, 7)}, 3);
    }
  }
  Measured m;
  for (int step = 0; step < 3; ++step) {
    m = {};
    for (int64_t micro = 0; micro < micro_batches; ++micro) {
      memory::reset_cpu_peak();
      models::Losses losses;
      {
        nn::AutocastGuard guard(c10::DeviceType::CPU, autocast, at::kBFloat16);
        losses = task->compute_losses(*model, b, 0);
      }
      m.forward = std::max(m.forward, memory::cpu_memory_stats().peak_bytes);
      memory::reset_cpu_peak();
      losses.total.backward();
      losses = {};
      m.backward = std::max(m.backward, memory::cpu_memory_stats().peak_bytes);
    }
    memory::reset_cpu_peak();
    adam.step();
    adam.zero_grad();
    m.step = memory::cpu_memory_stats().peak_bytes;
  }
  return m;
}

// At most 6% below what was measured (an underestimate is what runs out of memory) and 8% above, every phase.
// Recorded 2026-11-29 over these tests: -4.7% (Llama's forward at 512 tokens, docs/notes/memory-model-lab.md) to
// +2.6%.
constexpr double kUnder = 0.06, kOver = 0.08;

void expect_close(const char* what, int64_t predicted, int64_t measured, double under = kUnder, double over = kOver) {
  const double error = static_cast<double>(predicted - measured) / static_cast<double>(measured);
  std::printf("  %-10s predicted %8.2f MB  measured %8.2f MB  error %+6.1f%%\n", what, predicted / 1e6,
              measured / 1e6, 100 * error);
  EXPECT_GE(error, -under) << what << ": predicted below what was measured";
  EXPECT_LE(error, over) << what;
}

void check(const std::string& name, const std::string& json, int64_t batch, int64_t tokens, bool mlm,
           int64_t micro_batches = 1, bool autocast = false) {
  const auto recipe = recipe_from_json(name, json);
  TrainingJob job;  // one rank, the model as it is: DDP at world size 1 (no clipping copies, as in measure())
  job.strategy = parallel::Strategy::DDP, job.batch = batch, job.seq_len = tokens, job.grad_accum = micro_batches;
  job.mixed_precision = autocast ? parallel::Precision::BF16 : parallel::Precision::NO;
  const MemoryEstimate e = estimate_training_memory(*recipe, job);
  const Measured m = measure(*recipe, batch, tokens, mlm, micro_batches, autocast);
  std::printf("%s, batch %lld x %lld tokens x %lld micro-batches%s (%lld parameters):\n", name.c_str(),
              static_cast<long long>(batch), static_cast<long long>(tokens), static_cast<long long>(micro_batches),
              autocast ? ", bf16 autocast" : "", static_cast<long long>(e.parameters));
  expect_close("forward", e.forward_bytes, m.forward);
  expect_close("backward", e.backward_bytes, m.backward);
  expect_close("step", e.step_bytes, m.step);
  expect_close("peak", e.peak_bytes, m.peak());
}

const char* kBert = R"({"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 8000,
  "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
  "max_position_embeddings": 256, "hidden_dropout_prob": 0.0})";
const char* kBertDropout = R"({"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 8000,
  "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
  "max_position_embeddings": 256, "hidden_dropout_prob": 0.1})";
const char* kLlama = R"({"model_type": "llama", "vocab_size": 8000, "hidden_size": 256, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688, "max_position_embeddings": 512})";

TEST(MemoryModel, BertStepMatchesMeasurement) {
  check("bert", kBert, 8, 128, true);
  check("bert", kBert, 2, 256, true);
}

// Gradients accumulating in .grad over micro-batches, and the tied word table's head gradient held apart from
// .grad through backward (ModelRecipe::tied_tables).
TEST(MemoryModel, BertAccumulatingMatchesMeasurement) { check("bert", kBert, 4, 64, true, 3); }

// The tables a lookup and the head share, as each recipe names them, and what the estimate makes of them: with
// gradients accumulating in place the head's table-sized gradient is a term of the backward walk; reduced or
// replaced every step it is among the gradients already.
TEST(MemoryModel, TiedTableHeldThroughBackward) {
  const auto bert = recipe_from_json("bert", kBert);
  const int64_t table = 8000 * 256;
  EXPECT_EQ(model_shape(*bert).tied_tables, table);
  models::TaskSetup classify;
  classify.labels = {"no", "yes"};
  EXPECT_EQ(model_shape(*models::recipe_for_task(bert, "classify", classify)).tied_tables, 0);
  EXPECT_EQ(model_shape(*recipe_from_json("llama", kLlama)).tied_tables, 0);
  const auto t5 = models::recipe_of("t5-small");
  EXPECT_EQ(model_shape(*t5).tied_tables, 32128 * 512);

  TrainingJob job;
  job.strategy = parallel::Strategy::DDP, job.batch = 4, job.seq_len = 64, job.grad_accum = 3;  // the walk's peak
  ModelShape shape = model_shape(*bert);
  const MemoryEstimate tied = estimate_training_memory(*bert, shape, job);
  shape.tied_tables = 0;
  const MemoryEstimate untied = estimate_training_memory(*bert, shape, job);
  // (Without it the peak moves to the start of backward: less than the whole table.)
  EXPECT_GT(tied.backward_bytes - untied.backward_bytes, table * 4 / 2);
  EXPECT_LE(tied.backward_bytes - untied.backward_bytes, table * 4);
  ASSERT_EQ(tied.peak_phase, "backward");
  bool named = false;
  for (const MemoryTerm& term : tied.terms) named |= term.name == "tied table's gradient" && term.bytes == table * 4;
  EXPECT_TRUE(named);
  job.grad_accum = 1;  // the head's gradient becomes .grad: one gradient of the table in either case
  EXPECT_EQ(estimate_training_memory(*bert, shape, job).backward_bytes,
            estimate_training_memory(*bert, model_shape(*bert), job).backward_bytes);
}

// The backward walk takes each layer's own unit: T5's encoder layers, walked last where the gradients done are the
// most, are smaller than its decoder's (cross-attention). Registered the other way round — the larger walked last —
// the same parameters cost more; priced as the largest each, as before, order made no difference (FULL_SHARD with
// checkpointing: +8.5% against measurement then, +3.8% after, +2.2% with the layers walked each as it is;
// bench/memory_model.py).
TEST(MemoryModel, BackwardWalkTakesEachLayersOwnUnit) {
  const auto t5 = recipe_from_json("t5", R"({"model_type": "t5", "vocab_size": 8000, "d_model": 256, "d_kv": 64,
    "d_ff": 1024, "num_layers": 4, "num_heads": 4})");
  TrainingJob job;
  job.world = 2, job.batch = 4, job.seq_len = 64, job.activation_checkpointing = true;
  const ModelShape shape = model_shape(*t5);
  ASSERT_LT(shape.layer_numel.front(), shape.layer_numel.back());  // an encoder layer, a decoder layer
  ModelShape reversed = shape;
  std::reverse(reversed.layer_numel.begin(), reversed.layer_numel.end());
  std::reverse(reversed.layer_trainable.begin(), reversed.layer_trainable.end());
  const MemoryEstimate own = estimate_training_memory(*t5, shape, job);
  EXPECT_EQ(own.peak_phase, "backward");
  EXPECT_LT(own.backward_bytes, estimate_training_memory(*t5, reversed, job).backward_bytes);
}

// Activation offload moves what the layers keep to host memory: the end of forward holds none of it on the device
// (the host all of it), and backward two layers' at a time instead of every layer not yet done; the optimizer step
// is untouched. (Against measurement: bench/memory_model.py --offload, docs/notes/memory-model-offload.csv.)
TEST(MemoryModel, ActivationOffloadMovesWhatLayersKeepToTheHost) {
  const auto llama = recipe_from_json("llama", R"({"model_type": "llama", "vocab_size": 4000, "hidden_size": 256,
    "intermediate_size": 704, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4})");
  for (bool checkpointing : {false, true}) {
    TrainingJob job;
    job.world = 2, job.batch = 4, job.seq_len = 512, job.activation_checkpointing = checkpointing;
    const MemoryEstimate on_device = estimate_training_memory(*llama, job);
    job.activation_offload = true;
    const MemoryEstimate offloaded = estimate_training_memory(*llama, job);
    EXPECT_EQ(on_device.host_bytes, 0);
    EXPECT_GT(offloaded.host_bytes, 0);
    // What left the device at the end of forward is what the host holds (Llama has no bias every layer reads).
    EXPECT_LE(offloaded.forward_bytes, on_device.forward_bytes - offloaded.host_bytes * 7 / 8);
    EXPECT_LT(offloaded.backward_bytes, on_device.backward_bytes);
    EXPECT_EQ(offloaded.step_bytes, on_device.step_bytes);
    EXPECT_NE(format_estimate("llama", job, offloaded).find("activation offload"), std::string::npos);
  }
}

// Under tensor parallelism the shape is one rank's slices: model_shape splits the model built on the meta device by
// the family's plan as rank 0 would (over a group of shape alone, which moves nothing). The estimate shards them over
// the data-parallel ranks only; the split regions keep less, and sequence parallelism less again between them.
// (Against measurement: bench/memory_model.py --tp, docs/notes/memory-model-tp.csv.)
TEST(MemoryModel, TensorParallelCountsARanksSlices) {
  const auto llama = recipe_from_json("llama", kLlama);
  const ModelShape whole = model_shape(*llama), split = model_shape(*llama, 2);
  // A layer: q, k, v, o, gate, up and down halved (2 key/value heads: one a rank), its two norms whole; the
  // embedding and the head (the edge units) by vocabulary rows; the final norm whole.
  const int64_t norms = 2 * 256;
  EXPECT_EQ(split.layer_numel[0], (whole.layer_numel[0] - norms) / 2 + norms);
  EXPECT_EQ(split.input_numel, 4000 * 256);
  EXPECT_EQ(split.output_numel, 4000 * 256);
  EXPECT_EQ(split.root_numel, 256);
  EXPECT_EQ(split.tp, 2);
  testing::expect_error<std::logic_error>(
      [] {
        at::Tensor t = at::zeros({2});
        dist::Communicator::shape_only(0, 2).all_reduce(t, dist::ReduceOp::SUM);
      },
      {"all_reduce(SUM) on shape[0 of 2]", "moves nothing"});

  TrainingJob job;
  job.world = 2, job.batch = 4, job.seq_len = 256;
  const MemoryEstimate data_parallel = estimate_training_memory(*llama, job);
  job.tp = 2;
  const MemoryEstimate tensor_parallel = estimate_training_memory(*llama, split, job);
  EXPECT_EQ(tensor_parallel.parameters, split.parameters());
  EXPECT_LT(tensor_parallel.forward_bytes, data_parallel.forward_bytes);  // the same parameters a rank, less kept
  job.sequence_parallel = true;
  EXPECT_LT(estimate_training_memory(*llama, split, job).forward_bytes, tensor_parallel.forward_bytes);
  EXPECT_NE(format_estimate("llama", job, tensor_parallel).find("tensor parallel over 2 (sequence parallel)"),
            std::string::npos);
  testing::expect_error<std::logic_error>([&] { estimate_training_memory(*llama, whole, job); },
                                          {"counted at a tensor-parallel size of 1, the job's is 2"});
  job.world = 3;
  testing::expect_error<std::invalid_argument>([&] { estimate_training_memory(*llama, split, job); },
                                               {"tensor parallelism over 2 ranks", "3 ranks do not divide"});
}

TEST(MemoryModel, BertWithDropoutMatchesMeasurement) { check("bert-dropout", kBertDropout, 8, 128, true); }

// DDP's mixed precision: the residual stream in float32, each linear layer's own bfloat16 copy of its input, no
// copies of the embedding tables, the loss's float32 gradients (activation_model.h).
TEST(MemoryModel, AutocastStepMatchesMeasurement) {
  check("bert", kBert, 8, 128, true, 1, true);
  check("llama", kLlama, 2, 512, false, 1, true);
}

TEST(MemoryModel, LlamaStepMatchesMeasurement) {
  check("llama", kLlama, 8, 128, false);
  check("llama", kLlama, 2, 512, false);
}

// Causal LMs as sequence classifiers (LlamaForSequenceClassification, GPT2ForSequenceClassification with its
// dropout): the layers as the LM's, then the final norm over every token and one row per sample through the score.
TEST(MemoryModel, CausalLmClassifierStepMatchesMeasurement) {
  const std::string classes = R"("id2label": {"0": "a", "1": "b", "2": "c"})";
  const std::vector<std::pair<std::string, std::string>> models = {
      {"llama-classifier", R"({"model_type": "llama", "vocab_size": 8000, "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688, "max_position_embeddings": 512,
        "architectures": ["LlamaForSequenceClassification"], )" + classes + "}"},
      {"gpt2-classifier", R"({"model_type": "gpt2", "vocab_size": 8000, "n_embd": 256, "n_layer": 4, "n_head": 4,
        "n_positions": 512, "architectures": ["GPT2ForSequenceClassification"], )" + classes + "}"}};
  for (const auto& [name, json] : models) {
    const auto recipe = recipe_from_json(name, json);
    ASSERT_EQ(recipe->task()->name(), "classify");
    for (const int64_t tokens : {128, 512}) {
      TrainingJob job;
      job.strategy = parallel::Strategy::DDP, job.batch = 4, job.seq_len = tokens;
      const MemoryEstimate e = estimate_training_memory(*recipe, job);
      const Measured m = measure(*recipe, job.batch, tokens, false, 1, false, /*synthetic=*/true);
      std::printf("%s, batch 4 x %lld tokens:\n", name.c_str(), static_cast<long long>(tokens));
      expect_close("forward", e.forward_bytes, m.forward);
      expect_close("backward", e.backward_bytes, m.backward);
      expect_close("peak", e.peak_bytes, m.peak());
    }
  }
}

// T5's layers walked each as it is: backward replays the encoder's, over the whole input, after the decoder's, over
// the short targets (span corruption), and each keeps and replays what it does, not the two stacks' average (as the
// walk took it before 2026-11-25: backward -5.5% here, the encoder's layers priced low where the peak is).
TEST(MemoryModel, T5WalksEachLayerAsItIs) {
  const auto t5 = recipe_from_json("t5", R"({"model_type": "t5", "vocab_size": 8000, "d_model": 256, "d_kv": 64,
    "d_ff": 1024, "num_layers": 4, "num_heads": 4})");
  TrainingJob job;
  job.strategy = parallel::Strategy::DDP, job.batch = 4, job.seq_len = 256, job.activation_checkpointing = true;
  const MemoryEstimate e = estimate_training_memory(*t5, job);
  const Measured m = measure(*t5, job.batch, job.seq_len, false, 1, false, /*synthetic=*/true, /*checkpoint=*/true);
  std::printf("t5, batch 4 x 256 tokens, every layer checkpointed:\n");
  expect_close("forward", e.forward_bytes, m.forward, 0.03, 0.03);
  expect_close("backward", e.backward_bytes, m.backward, 0.03, 0.03);
  expect_close("peak", e.peak_bytes, m.peak(), 0.03, 0.03);
}

}  // namespace
}  // namespace shardtrain::plan
