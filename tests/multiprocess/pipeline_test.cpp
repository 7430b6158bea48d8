// A pipeline (pp/pipeline.h) over the launcher's ranks gives the gradients one process computes: a stack of
// Linear + tanh layers split into stages, every schedule (GPipe, 1F1B, interleaved with 2 stages a rank, zero
// bubble) x microbatch counts, in float64 so that any difference is a wrong gradient, not rounding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_env.h"
#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/pp/pipeline.h"

namespace shardtrain::pp {
namespace {

using testing::test_process_group;
using Kind = parallel::PipelineSchedule;

constexpr int64_t kWidth = 6, kRows = 3, kLayersPerStage = 2;

// Layer l of the whole stack: the same on every rank (seeded by its index).
torch::nn::Linear make_layer(int l) {
  torch::manual_seed(100 + l);
  torch::nn::Linear layer(kWidth, kWidth);
  layer->to(at::kDouble);
  return layer;
}

at::Tensor microbatch_input(int m) {
  return at::sin(at::arange(kRows * kWidth, at::kDouble).reshape({kRows, kWidth}) * (m + 1) * 0.37);
}
at::Tensor microbatch_target(int m) { return at::cos(microbatch_input(m) * 1.3); }

// Layers [first, first + count) of the stack; the last stage's loss is the mean squared error / M.
struct StackStage : Stage {
  std::vector<torch::nn::Linear> layers;
  int microbatches = 1;
  int lasts = 0;  // backward actions announced as the step's last weight gradients
  void before_backward(bool last) override { lasts += last; }
  at::Tensor forward(const at::Tensor& input, int) override {
    at::Tensor x = input;
    for (auto& layer : layers) x = at::tanh(layer->forward(x));
    return x;
  }
  at::Tensor loss(const at::Tensor& output, int m) override {
    return (output - microbatch_target(m)).pow(2).mean() / microbatches;
  }
};

TEST(Pipeline, EveryScheduleGivesOneProcesssGradients) {
  const dist::Communicator& world = test_process_group().world();
  const int P = world.size(), rank = world.rank();
  struct Case {
    Kind kind;
    int microbatches, stages_per_rank;
  };
  std::vector<Case> cases = {{Kind::GPIPE, 1, 1},          {Kind::GPIPE, P + 1, 1},       {Kind::ONE_F_ONE_B, P, 1},
                             {Kind::ONE_F_ONE_B, 2 * P + 1, 1}, {Kind::ZERO_BUBBLE, P, 1},   {Kind::ZERO_BUBBLE, 2 * P + 1, 1},
                             {Kind::INTERLEAVED_1F1B, P, 2}, {Kind::INTERLEAVED_1F1B, 2 * P, 2}};
  for (const Case& c : cases) {
    ScheduleShape shape;
    shape.kind = c.kind, shape.ranks = P, shape.microbatches = c.microbatches, shape.stages_per_rank = c.stages_per_rank;
    SCOPED_TRACE(parallel::to_string(c.kind) + " P=" + std::to_string(P) + " M=" + std::to_string(c.microbatches));
    const int layers = shape.stages() * kLayersPerStage;
    // The reference: the whole stack in one process, every microbatch.
    std::vector<torch::nn::Linear> whole;
    for (int l = 0; l < layers; ++l) whole.push_back(make_layer(l));
    double reference_loss = 0;
    for (int m = 0; m < c.microbatches; ++m) {
      at::Tensor x = microbatch_input(m);
      for (auto& layer : whole) x = at::tanh(layer->forward(x));
      at::Tensor loss = (x - microbatch_target(m)).pow(2).mean() / c.microbatches;
      loss.backward();
      reference_loss += loss.item<double>();
    }
    // This rank's stages, their layers made as the reference's.
    std::vector<std::unique_ptr<StackStage>> owned;
    std::map<int, Stage*> mine;
    for (int s = 0; s < shape.stages(); ++s) {
      if (shape.rank_of(s) != rank) continue;
      auto stage = std::make_unique<StackStage>();
      stage->microbatches = c.microbatches;
      for (int l = s * kLayersPerStage; l < (s + 1) * kLayersPerStage; ++l) stage->layers.push_back(make_layer(l));
      mine[s] = stage.get();
      owned.push_back(std::move(stage));
    }
    Pipeline pipeline(make_schedule(shape), world, mine);
    const StepResult result = pipeline.step(microbatch_input);
    if (shape.rank_of(shape.stages() - 1) == rank) EXPECT_NEAR(result.loss, reference_loss, 1e-12);
    for (const auto& [s, stage] : mine) {
      auto* stack = static_cast<StackStage*>(stage);
      EXPECT_EQ(stack->lasts, 1) << "stage " << s << ": one backward action a step reduces its gradients";
      for (int i = 0; i < kLayersPerStage; ++i) {
        const auto ours = stack->layers[i]->parameters(), theirs = whole[s * kLayersPerStage + i]->parameters();
        for (size_t p = 0; p < ours.size(); ++p) {
          ASSERT_TRUE(ours[p].grad().defined()) << "stage " << s << " layer " << i;
          EXPECT_LT((ours[p].grad() - theirs[p].grad()).abs().max().item<double>(), 1e-12)
              << "stage " << s << " layer " << i << " parameter " << p;
        }
      }
    }
  }
}

// A Llama (llama-debug made 8 layers deep) cut into stages by whole layers — embeddings on the first, norm, head and
// loss on the last — gives the one-process causal LM's loss and gradients under every schedule: the whole batch's
// token-mean loss in one process against the microbatches' through the pipeline (rows of equal length, so the mean
// of their means is the whole batch's).
TEST(Pipeline, LlamaStagesGiveOneProcesssGradients) {
  const dist::Communicator& world = test_process_group().world();
  const int P = world.size(), rank = world.rank();
  const auto recipe = models::recipe_of_model("llama-debug", {{"layers", 8}});
  auto llama_of = [&] { return models::Llama(std::dynamic_pointer_cast<models::LlamaImpl>(models::build_model(recipe).module)); };
  constexpr int64_t kRowsPerMicrobatch = 2, kTokens = 12;
  struct Case {
    Kind kind;
    int microbatches, stages_per_rank;
  };
  for (const Case& c : {Case{Kind::GPIPE, P + 1, 1}, Case{Kind::ONE_F_ONE_B, 2 * P, 1}, Case{Kind::ZERO_BUBBLE, P + 1, 1},
                        Case{Kind::INTERLEAVED_1F1B, P, 2}}) {
    ScheduleShape shape;
    shape.kind = c.kind, shape.ranks = P, shape.microbatches = c.microbatches, shape.stages_per_rank = c.stages_per_rank;
    SCOPED_TRACE(parallel::to_string(c.kind) + " P=" + std::to_string(P) + " M=" + std::to_string(c.microbatches));
    const int64_t rows = kRowsPerMicrobatch * c.microbatches;
    at::Generator gen = at::detail::createCPUGenerator(7);
    const at::Tensor ids = at::randint(0, recipe->task()->data_needs().vocab_size, {rows, kTokens}, gen, at::kLong);
    const at::Tensor mask = at::ones({rows, kTokens}, at::kLong);
    models::Llama reference = llama_of();
    const at::Tensor reference_loss = reference->run(ids, mask, ids, /*labelled_only=*/true).loss;
    reference_loss.backward();
    std::map<std::string, at::Tensor> reference_grads;
    for (const auto& p : reference->named_parameters()) reference_grads[p.key()] = p.value().grad();

    // This rank's stages: one model built with their layers only (BuildOptions::stages), the weights the whole
    // model's (drawn by name).
    const auto split = models::split_layers(8, shape.stages());
    models::BuildOptions build;
    build.stages = models::stages_of_rank(shape, split, rank);
    models::Llama model(std::dynamic_pointer_cast<models::LlamaImpl>(models::build_model(recipe, build).module));
    int64_t held = 0;
    for (const auto& run : build.stages) held += run.count;
    EXPECT_EQ(static_cast<int64_t>(model->layers.size()), held) << "only this rank's layers are built";
    EXPECT_EQ(model->embed.is_empty(), rank != 0);
    EXPECT_EQ(model->lm_head.is_empty(), shape.rank_of(shape.stages() - 1) != rank);
    auto text = [&](int m) {
      return models::MicrobatchText{mask.narrow(0, m * kRowsPerMicrobatch, kRowsPerMicrobatch),
                                    ids.narrow(0, m * kRowsPerMicrobatch, kRowsPerMicrobatch)};
    };
    std::vector<std::unique_ptr<models::LlamaStage>> owned;
    std::map<int, Stage*> mine;
    for (int s = 0, run = 0; s < shape.stages(); ++s) {
      if (shape.rank_of(s) != rank) continue;
      owned.push_back(std::make_unique<models::LlamaStage>(model, run++, c.microbatches, text));
      mine[s] = owned.back().get();
    }
    Pipeline pipeline(make_schedule(shape), world, mine);
    const StepResult result =
        pipeline.step([&](int m) { return ids.narrow(0, m * kRowsPerMicrobatch, kRowsPerMicrobatch); });
    if (shape.rank_of(shape.stages() - 1) == rank) EXPECT_NEAR(result.loss, reference_loss.item<double>(), 1e-5);
    int compared = 0;
    for (const auto& stage : owned) {
      for (const auto& [name, p] : stage->named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        EXPECT_LT((p.grad() - reference_grads.at(name)).abs().max().item<double>(), 2e-6) << name;
        ++compared;
      }
    }
    EXPECT_GT(compared, 0);
  }
  // A stage of no layers, and a model whose head is its embedding's table, are refused, naming why.
  EXPECT_THROW(models::split_layers(8, 9), std::invalid_argument);
  models::BuildOptions stages;
  stages.stages = {{0, 1}};
  try {
    models::build_model(models::recipe_of("llama-3.2-debug"), stages);
    ADD_FAILURE() << "a tied head's stages were built";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tied to its embedding"), std::string::npos) << e.what();
  }
  EXPECT_THROW(models::build_model(models::recipe_of("bert-debug"), stages), std::invalid_argument);
}

// Two steps through one pipeline: the second reuses the agreed shapes and adds to the gradients (accumulation); an
// output whose shape changes after the first message across its boundary is refused, naming the stage.
TEST(Pipeline, ShapesAreAgreedOnceAndKept) {
  const dist::Communicator& world = test_process_group().world();
  const int P = world.size(), rank = world.rank();
  if (P == 1) GTEST_SKIP() << "one rank sends nothing";
  ScheduleShape shape;
  shape.kind = Kind::ONE_F_ONE_B, shape.ranks = P, shape.microbatches = P;
  StackStage stage;
  stage.microbatches = P;
  for (int l = rank * kLayersPerStage; l < (rank + 1) * kLayersPerStage; ++l) stage.layers.push_back(make_layer(l));
  Pipeline pipeline(make_schedule(shape), world, {{rank, &stage}});
  pipeline.step(microbatch_input);
  const at::Tensor once = stage.layers[0]->weight.grad().clone();
  pipeline.step(microbatch_input);
  EXPECT_LT((stage.layers[0]->weight.grad() - 2 * once).abs().max().item<double>(), 1e-12);
  if (rank == 0) {
    EXPECT_THROW(
        {
          try {
            pipeline.step([](int m) { return microbatch_input(m).narrow(0, 0, kRows - 1); });
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("stage 0's output is [2, 6]"), std::string::npos) << e.what();
            throw;
          }
        },
        std::invalid_argument);
  }
}

}  // namespace
}  // namespace shardtrain::pp
