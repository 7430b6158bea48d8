// Generation (models/generation.h): each cached step's logits are the whole sequence's at that position, a prompt
// left-padded in a batch makes what it makes alone, the loop's stopping and padding, sampling's options, and the
// errors. Against transformers' generate(): tests/models/hf_parity_test.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/models/generation.h"
#include "shardtrain/models/gpt2.h"
#include "shardtrain/models/llama.h"
#include "shardtrain/models/t5.h"
#include "shardtrain/models/zoo.h"
#include "support/expect_error.h"

namespace shardtrain::models {
namespace {

using shardtrain::testing::expect_error;

ZooModel built(const std::string& flavor) {
  BuildOptions build;
  build.init.seed = 11;
  ZooModel m = build_model(flavor, build);
  m.module->eval();
  return m;
}

// The whole sequence's logits (B, T, vocab) through the model's ordinary forward.
at::Tensor whole_logits(ZooModel& m, const at::Tensor& prompt, const at::Tensor& made) {
  if (auto* t5 = dynamic_cast<T5Impl*>(m.module.get())) {
    const at::Tensor start = at::zeros({prompt.size(0), 1}, prompt.options());
    return t5->run(prompt, at::ones_like(prompt), at::cat({start, made}, 1)).logits;
  }
  const at::Tensor ids = at::cat({prompt, made}, 1);
  if (auto* llama = dynamic_cast<LlamaImpl*>(m.module.get())) return llama->run(ids).logits;
  return dynamic_cast<Gpt2Impl&>(*m.module).run(ids).logits;
}

// Greedy steps through the decoder, each step's logits against the whole sequence's at the same position (Mistral's
// 8-token window is passed: 12 prompt tokens and 10 more).
TEST(Generation, CachedStepsGiveTheWholeSequencesLogits) {
  at::NoGradGuard no_grad;
  for (const std::string flavor : {"llama-debug", "llama-3.2-debug", "mistral-debug", "qwen3-debug", "gpt2-debug",
                                   "t5-debug"}) {
    SCOPED_TRACE(flavor);
    ZooModel m = built(flavor);
    const at::Tensor prompt = at::randint(3, 1000, {2, 12}, at::kLong);
    std::vector<at::Tensor> steps, made;
    {
      const auto decoder = m.recipe->text_decoder(*m.module);
      steps.push_back(decoder->start(prompt, at::ones_like(prompt)));
      for (int step = 0; step < 10; ++step) {
        made.push_back(steps.back().argmax(-1));
        steps.push_back(decoder->next(made.back()));
      }
    }
    const at::Tensor whole = whole_logits(m, prompt, at::stack(made, 1));
    const bool t5 = flavor == "t5-debug";
    const at::Tensor ours = at::stack(steps, 1);  // (B, 11, vocab): after the prompt, then after each token
    const at::Tensor theirs = whole.narrow(1, t5 ? 0 : prompt.size(1) - 1, 11);
    const double scale = theirs.abs().max().item<double>();
    EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-5 * scale);
  }
}

// A short prompt padded on the left beside a long one makes the tokens it makes alone: its positions count from
// its first token, and no query sees the padding.
TEST(Generation, LeftPaddingChangesNoRowsTokens) {
  for (const std::string flavor : {"llama-debug", "mistral-debug", "gpt2-debug", "t5-debug"}) {
    SCOPED_TRACE(flavor);
    ZooModel m = built(flavor);
    GenerationOptions options;
    options.max_new_tokens = 8;
    const at::Tensor long_prompt = at::randint(3, 1000, {1, 11}, at::kLong);
    const at::Tensor short_prompt = at::randint(3, 1000, {1, 4}, at::kLong);
    auto alone = [&](const at::Tensor& p) {
      return generate(*m.recipe->text_decoder(*m.module), p, at::ones_like(p), options).tokens;
    };
    const at::Tensor padded = at::cat({at::zeros({1, 7}, at::kLong), short_prompt}, 1);
    const at::Tensor mask = at::cat({at::ones({1, 11}, at::kLong),
                                     at::cat({at::zeros({1, 7}, at::kLong), at::ones({1, 4}, at::kLong)}, 1)});
    const at::Tensor both = generate(*m.recipe->text_decoder(*m.module), at::cat({long_prompt, padded}), mask,
                                     options).tokens;
    EXPECT_TRUE(at::equal(both[0], alone(long_prompt)[0]));
    EXPECT_TRUE(at::equal(both[1], alone(short_prompt)[0]));
  }
}

// Logits from a script: row r's step s favours token script[r][s].
class ScriptedDecoder : public TextDecoder {
 public:
  explicit ScriptedDecoder(std::vector<std::vector<int64_t>> script) : script_(std::move(script)) {}
  at::Tensor start(const at::Tensor&, const at::Tensor&) override { return logits(); }
  at::Tensor next(const at::Tensor& tokens) override {
    received.push_back(tokens.clone());
    return logits();
  }
  std::vector<at::Tensor> received;

 private:
  at::Tensor logits() {
    at::Tensor l = at::zeros({static_cast<int64_t>(script_.size()), 20});
    for (size_t r = 0; r < script_.size(); ++r) l[static_cast<int64_t>(r)][script_[r][step_]] = 5.0;
    ++step_;
    return l;
  }
  std::vector<std::vector<int64_t>> script_;
  size_t step_ = 0;
};

// A row that makes an end-of-sequence token ends: pad after it, its length counts the token; the loop stops when
// every row has ended, without asking the decoder for a step more.
TEST(Generation, RowsEndAtTheirEndOfSequenceToken) {
  ScriptedDecoder decoder({{4, 2, 9, 9, 9}, {5, 6, 7, 3, 9}});
  GenerationOptions options;
  options.max_new_tokens = 5, options.eos_token_ids = {2, 3}, options.pad_token_id = 0;
  const at::Tensor prompt = at::ones({2, 3}, at::kLong);
  const Generated out = generate(decoder, prompt, at::ones_like(prompt), options);
  EXPECT_TRUE(at::equal(out.tokens, at::tensor({4, 2, 0, 0, 5, 6, 7, 3}, at::kLong).view({2, 4})));
  EXPECT_EQ(out.lengths, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(decoder.received.size(), 3u);  // after tokens 1, 2 and 3; none after the 4th ended the last row
  // max_new_tokens ends it too: no step asked past it.
  ScriptedDecoder capped({{4, 4, 4, 4, 4}});
  options.max_new_tokens = 3;
  const at::Tensor one = at::ones({1, 2}, at::kLong);
  EXPECT_EQ(generate(capped, one, at::ones_like(one), options).tokens.size(1), 3);
  EXPECT_EQ(capped.received.size(), 2u);
}

// Sampling: a seed gives the same tokens again and another seed others; top-k 1 is greedy; greedy ignores the
// sampling options.
TEST(Generation, SamplingFollowsItsSeedAndOptions) {
  ZooModel m = built("gpt2-debug");
  const at::Tensor prompt = at::randint(3, 1000, {2, 5}, at::kLong);
  auto run = [&](const GenerationOptions& o) {
    return generate(*m.recipe->text_decoder(*m.module), prompt, at::ones_like(prompt), o).tokens;
  };
  GenerationOptions sample;
  sample.do_sample = true, sample.max_new_tokens = 12, sample.top_k = 0, sample.temperature = 2.0, sample.seed = 5;
  const at::Tensor first = run(sample);
  EXPECT_TRUE(at::equal(run(sample), first));
  sample.seed = 6;
  EXPECT_FALSE(at::equal(run(sample), first));
  GenerationOptions greedy;
  greedy.max_new_tokens = 12;
  const at::Tensor expected = run(greedy);
  sample.top_k = 1;
  EXPECT_TRUE(at::equal(run(sample), expected));
  greedy.temperature = 0.1, greedy.top_k = 3, greedy.top_p = 0.2;
  EXPECT_TRUE(at::equal(run(greedy), expected));
}

TEST(Generation, BadOptionsAndModelsAreNamed) {
  GenerationOptions o;
  o.max_new_tokens = 0;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"max_new_tokens 0", "at least 1"});
  o = {}, o.do_sample = true, o.temperature = 0;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"temperature 0", "above 0"});
  o = {}, o.top_p = 1.5;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"top_p 1.5", "(0, 1]"});
  o = {}, o.top_k = -1;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"top_k -1"});
  o = {}, o.repetition_penalty = 0;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"repetition_penalty 0"});
  o = {}, o.num_beams = 0;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"num_beams 0", "at least 1"});
  o = {}, o.num_beams = 4, o.do_sample = true;
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"num_beams 4", "beam sampling"});
  o = {}, o.early_stopping = "soon";
  expect_error<std::invalid_argument>([&] { check_generation_options(o); }, {"'soon'", "true, false or never"});
  // A decoder that cannot reorder its rows does no beam search.
  ScriptedDecoder scripted({{1, 1}, {1, 1}});
  o = {}, o.num_beams = 2;
  const at::Tensor two = at::ones({1, 2}, at::kLong);
  expect_error<std::invalid_argument>([&] { generate(scripted, two, at::ones_like(two), o); }, {"reorder"});
  ZooModel bert = built("bert-debug");
  expect_error<std::invalid_argument>([&] { bert.recipe->text_decoder(*bert.module); },
                                      {"bert", "does not generate text", "gpt2"});
  ZooModel gpt2 = built("gpt2-debug");
  const auto decoder = gpt2.recipe->text_decoder(*gpt2.module);
  expect_error<std::invalid_argument>([&] { gpt2.recipe->text_decoder(*gpt2.module); }, {"already generating"});
  const at::Tensor prompt = at::ones({1, 4}, at::kLong);
  expect_error<std::invalid_argument>([&] { generate(*decoder, prompt, at::ones({1, 3}, at::kLong), {}); },
                                      {"[1, 4]", "[1, 3]"});
  // Past the position table: the positions so far named.
  GenerationOptions long_run;
  long_run.max_new_tokens = 200;
  expect_error<std::invalid_argument>([&] { generate(*decoder, prompt, at::ones_like(prompt), long_run); },
                                      {"129 tokens", "128"});
}

}  // namespace
}  // namespace shardtrain::models
