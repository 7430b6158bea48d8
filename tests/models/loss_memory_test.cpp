// What backward adds above the end of forward, ours against transformers' on the same weights and batch, at shapes
// where the vocabulary dominates (32k on 64-wide layers: a (B, T, V) float32 logits tensor is 33 MB, the rest of
// the step a few): tests/reference/loss_memory_reference.py measures transformers' with the same counting
// allocator and saves the models and batches (the directory is SHARDTRAIN_LOSS_MEMORY, set by ctest). Each family's
// loss path — causal LM (Llama, GPT-2), masked LM (BERT), seq2seq (T5), a classifier — called both ways: the loss
// alone (the head fused with the cross-entropy in chunks, what the trainer runs) and the logits with the loss from
// them (what transformers' forward(labels=...) computes), the outputs dropped as `model(...).loss` drops them; the
// LMs and T5 again with every layer checkpointed ("<case>-checkpointed", transformers' non-reentrant checkpointing
// on the other side), where whatever a layer takes as input is kept through backward.
// Neither may need more than transformers' at the step's peak, nor (but a classifier, below) add more in backward:
// an extra logits-sized tensor held through backward is 33 MB here. Measured 2026-11-30: the logits path adds
// exactly what transformers' does, the loss alone 0-14% of it, checkpointed or not; a loss term that keeps the
// logits through backward fails every logits case by 32 MB, and a (B, 1, T, T) attention bias made of a mask of
// ones fails the checkpointed Llama and GPT-2 by 64 KiB.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "shardtrain/io/safetensors.h"
#include "shardtrain/memory/memory_stats.h"
#include "shardtrain/models/bert.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/parallelize.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/weights.h"
#include "shardtrain/models/zoo.h"

namespace shardtrain::models {
namespace {

std::string fixture_dir() {
  const char* dir = std::getenv("SHARDTRAIN_LOSS_MEMORY");
  if (dir == nullptr) throw std::runtime_error("SHARDTRAIN_LOSS_MEMORY is not set (ctest sets it)");
  return dir;
}

// The case's loss on `in`, by the model's family, as loss_memory_reference.py takes transformers'.
at::Tensor loss_of(const std::string& family, torch::nn::Module& m, const std::map<std::string, at::Tensor>& in,
                   bool labelled_only) {
  auto get = [&](const char* name) { return in.count(name) ? in.at(name) : at::Tensor(); };
  if (family == "llama") {
    return dynamic_cast<LlamaImpl&>(m).run(get("input_ids"), get("attention_mask"), get("labels"), labelled_only).loss;
  }
  if (family == "gpt2") {
    return dynamic_cast<Gpt2Impl&>(m).run(get("input_ids"), get("attention_mask"), get("labels"), labelled_only).loss;
  }
  if (family == "bert") {
    return dynamic_cast<BertImpl&>(m)
        .run(get("input_ids_masked"), get("attention_mask"), {}, get("mlm_labels"), labelled_only)
        .loss;
  }
  if (family == "t5") {
    return dynamic_cast<T5Impl&>(m).run(get("input_ids"), get("attention_mask"), {}, get("labels"), labelled_only).loss;
  }
  throw std::invalid_argument("loss_memory_test: no loss for family " + family);
}

struct Added {
  int64_t kept = 0;   // live when forward with the loss has returned, above what was live before it
  int64_t above = 0;  // the most live during backward, above the end of forward
  int64_t peak() const { return kept + above; }  // the step's peak above its start
};

// As the reference measures: the second of two steps, gradients set to None before each; every layer checkpointed
// when `checkpointed`.
Added backward_above_forward(const std::string& dir, bool labelled_only, bool checkpointed) {
  memory::install_cpu_memory_counter();
  ZooModel model = build_model(recipe_of_model(dir));
  load_weights(*model.module, dir, model.names);
  if (checkpointed) activation_checkpoint_layers(model, 1);
  model.module->train();
  const io::SafetensorsReader file(dir + "/batch.safetensors");
  std::map<std::string, at::Tensor> batch;
  for (const auto& e : file.entries()) batch[e.name] = file.read(e.name);
  Added added;
  for (int step = 0; step < 2; ++step) {
    model.module->zero_grad(/*set_to_none=*/true);
    const int64_t start = memory::cpu_memory_stats().current_bytes;
    at::Tensor loss = loss_of(model.family, *model.module, batch, labelled_only);
    const int64_t end = memory::cpu_memory_stats().current_bytes;
    memory::reset_cpu_peak();
    loss.backward();
    added = {end - start, memory::cpu_memory_stats().peak_bytes - end};
  }
  return added;
}

// Both measures: what backward adds above the end of forward, the issue's, where a logits-sized tensor held through
// backward shows whole; and the step's peak above its start, which also holds where the peak is at the end of
// backward (a classifier's: the embedding's gradient, whatever forward kept, so that keeping less in forward adds
// as much to the first measure).
TEST(LossMemory, BackwardAddsNoMoreThanTransformers) {
  std::ifstream in(fixture_dir() + "/backward.json");
  ASSERT_TRUE(in) << fixture_dir() << "/backward.json: the fixture (loss_memory_reference.py) did not write it";
  const nlohmann::json theirs = nlohmann::json::parse(in);
  ASSERT_GE(theirs.size(), 9u);
  for (const auto& [name, reference] : theirs.items()) {
    const Added limit{reference.at("kept_bytes").get<int64_t>(), reference.at("above_bytes").get<int64_t>()};
    const std::string suffix = "-checkpointed";
    const bool checkpointed = name.size() > suffix.size() && name.rfind(suffix) == name.size() - suffix.size();
    const std::string dir = fixture_dir() + "/" + name.substr(0, name.size() - (checkpointed ? suffix.size() : 0));
    for (const bool labelled_only : {true, false}) {
      const std::string how = name + (labelled_only ? ", the loss alone" : ", logits with the loss");
      const Added ours = backward_above_forward(dir, labelled_only, checkpointed);
      std::printf("%-38s forward keeps %6.2f / %6.2f MB, backward adds %6.2f / %6.2f MB (ours / transformers')\n",
                  how.c_str(), ours.kept / 1e6, limit.kept / 1e6, ours.above / 1e6, limit.above / 1e6);
      EXPECT_LE(ours.peak(), limit.peak()) << how << ": the step's peak " << ours.peak() << " bytes above its start, "
                                           << "transformers' " << limit.peak() << " (forward keeps " << ours.kept
                                           << " / " << limit.kept << ", backward adds " << ours.above << " / "
                                           << limit.above << ")";
      const bool classifier = name.find("classifier") != std::string::npos;
      if (!classifier) {
        EXPECT_LE(ours.above, limit.above) << how << ": backward adds " << ours.above << " bytes above the end of "
                                           << "forward, transformers' " << limit.above;
      }
    }
  }
}

}  // namespace
}  // namespace shardtrain::models
