// The memory model's moments one at a time (plan/step_phases.h) over a grid of jobs on the debug models of every
// family: each moment's terms add up to what it holds above the step's base, each phase's peak is its largest
// moment, the estimate's terms add up to its peak; and the policies the model reads from the runtime
// (fsdp::reshards_after_forward, dist::reduce_scatter_scratch_bytes) as the model uses them.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "plan/step_layout.h"
#include "plan/step_phases.h"
#include "shardtrain/distributed/communicator.h"
#include "shardtrain/fsdp/fully_shard.h"
#include "shardtrain/models/zoo.h"
#include "shardtrain/plan/memory_model.h"
#include "support/expect_error.h"

namespace shardtrain::plan {
namespace {

int64_t sum_of(const std::vector<MemoryTerm>& terms) {
  return std::accumulate(terms.begin(), terms.end(), int64_t{0},
                         [](int64_t a, const MemoryTerm& t) { return a + t.bytes; });
}

std::string label(const std::string& flavor, const TrainingJob& job) {
  return flavor + " " + parallel::to_string(job.strategy) + " W=" + std::to_string(job.world) + " " +
         parallel::to_string(job.mixed_precision) + (job.activation_checkpointing ? " AC" : "") +
         (job.grad_accum > 1 ? " accum" : "") + (job.cpu_offload ? " offload" : "") +
         (job.device == parallel::Device::CUDA ? " cuda" : " cpu");
}

// Every family's debug model (FLAVA's codebook as an extra unit, Llama's edge units, T5's two stacks, GPT-2's tied
// table, ViT's images) under every strategy, precision, checkpointing, accumulation, offload and device.
std::vector<std::pair<std::string, TrainingJob>> job_grid() {
  std::vector<std::pair<std::string, TrainingJob>> grid;
  for (const char* flavor : {"flava-debug", "bert-debug", "vit-debug", "t5-debug", "llama-debug", "gpt2-debug"}) {
    int variant = 0;
    for (const std::string& name : parallel::strategy_names()) {
      const parallel::Strategy strategy = parallel::strategy_named(name);
      for (parallel::Precision precision : {parallel::Precision::NO, parallel::Precision::BF16}) {
        TrainingJob job;
        job.strategy = strategy, job.mixed_precision = precision;
        job.world = 4, job.nodes = strategy == parallel::Strategy::HYBRID_SHARD ? 2 : 1;
        job.batch = 2, job.seq_len = 16;
        job.activation_checkpointing = variant % 2 == 1;
        job.grad_accum = variant % 3 == 0 ? 2 : 1;
        job.cpu_offload = variant % 5 == 4;
        job.device = variant % 4 == 3 ? parallel::Device::CUDA : parallel::Device::CPU;
        grid.emplace_back(flavor, job);
        ++variant;
      }
    }
  }
  return grid;
}

TEST(StepPhases, EachMomentsTermsAddUpToWhatItHoldsAboveTheBase) {
  for (const auto& [flavor, job] : job_grid()) {
    const auto recipe = models::recipe_of(flavor);
    const ModelShape shape = model_shape(*recipe);
    const StepLayout s = step_layout(*recipe, shape, job);
    const std::string what = label(flavor, job);
    const Walk walk = backward_walk(s);
    for (const Moment& m : {forward_start(s), forward_loss(s), forward_layers(s), backward_start(s),
                            head_reduction(s), walk.peak, backward_end(s)}) {
      EXPECT_EQ(sum_of(m.terms), m.bytes - s.base) << what;
      EXPECT_GE(m.bytes, s.base) << what;
    }
    const Moment step = optimizer_step(s);
    EXPECT_EQ(sum_of(step.terms), step.bytes - s.dev_params - s.dev_adam) << what;

    // The estimate: each phase its largest moment (with the CUDA allocator's allowance on top), its terms adding
    // up to its peak.
    const MemoryEstimate e = estimate_training_memory(*recipe, shape, job);
    const bool cuda = job.device == parallel::Device::CUDA;
    const auto with_allowance = [cuda](int64_t bytes) {
      return bytes + (cuda ? static_cast<int64_t>(static_cast<double>(bytes) * 0.05) : 0);
    };
    EXPECT_EQ(e.forward_bytes, with_allowance(largest({forward_start(s), forward_loss(s), forward_layers(s)}).bytes))
        << what;
    EXPECT_EQ(e.backward_bytes,
              with_allowance(largest({backward_start(s), head_reduction(s), walk.peak, backward_end(s)}).bytes))
        << what;
    EXPECT_EQ(e.step_bytes, with_allowance(step.bytes)) << what;
    EXPECT_EQ(sum_of(e.terms), e.peak_bytes) << what;
  }
}

TEST(StepPhases, LargestTakesTheFirstOfEqualMoments) {
  const Moment a{10, {{"a", 10, ""}}}, b{10, {{"b", 10, ""}}}, c{12, {{"c", 12, ""}}};
  EXPECT_EQ(largest({a, b}).terms.front().name, "a");
  EXPECT_EQ(largest({a, b, c}).terms.front().name, "c");
  EXPECT_EQ(largest({c, a}).terms.front().name, "c");
}

// The model reads which strategies reshard after forward from the runtime's own description, the one
// strategy_groups applies: resharding strategies gather only the root and a layer or two in forward, the others
// keep every unit gathered.
TEST(StepPhases, ReshardingFollowsTheRuntimesPolicy) {
  const auto recipe = models::recipe_of("llama-debug");
  const ModelShape shape = model_shape(*recipe);
  for (const std::string& name : parallel::strategy_names()) {
    const parallel::Strategy strategy = parallel::strategy_named(name);
    TrainingJob job;
    job.strategy = strategy, job.world = 4, job.nodes = 2, job.seq_len = 16;
    const StepLayout s = step_layout(*recipe, shape, job);
    EXPECT_EQ(s.reshard, fsdp::reshards_after_forward(strategy)) << parallel::to_string(strategy);
    if (s.gathers) {
      const int64_t gathered = forward_layers(s).terms.front().bytes;
      EXPECT_EQ(gathered, s.reshard ? s.root_g + 2 * s.layer_g : s.all_g - s.out_g) << parallel::to_string(strategy);
    }
  }
  EXPECT_TRUE(fsdp::reshards_after_forward(parallel::Strategy::FULL_SHARD));
  EXPECT_FALSE(fsdp::reshards_after_forward(parallel::Strategy::SHARD_GRAD_OP));
  EXPECT_FALSE(fsdp::reshards_after_forward(parallel::Strategy::DDP));
}

// A reduce-scatter's scratch as Communicator::reduce_scatter allocates it: Gloo's two receive buffers (one with a
// single peer), bf16's float32 accumulator and slice copy; nothing on NCCL or alone. The model's reduction is the
// input, the output shard and that.
TEST(StepPhases, ReduceScatterCountsTheCommunicatorsScratch) {
  const int64_t out = 1000;
  EXPECT_EQ(dist::reduce_scatter_scratch_bytes(dist::CommBackend::GLOO, out, 2, 4), out * 4);
  EXPECT_EQ(dist::reduce_scatter_scratch_bytes(dist::CommBackend::GLOO, out, 4, 4), 2 * out * 4);
  EXPECT_EQ(dist::reduce_scatter_scratch_bytes(dist::CommBackend::GLOO, out, 4, 2), 2 * out * 2 + 2 * out * 4);
  const int64_t large = (int64_t{1} << 20) + 5;  // bf16 adds in slices of 2^20 elements
  EXPECT_EQ(dist::reduce_scatter_scratch_bytes(dist::CommBackend::GLOO, large, 3, 2),
            2 * large * 2 + (large + (int64_t{1} << 20)) * 4);
  EXPECT_EQ(dist::reduce_scatter_scratch_bytes(dist::CommBackend::NCCL, out, 8, 2), 0);
  EXPECT_EQ(dist::reduce_scatter_scratch_bytes(dist::CommBackend::GLOO, out, 1, 2), 0);

  const auto recipe = models::recipe_of("bert-debug");
  const ModelShape shape = model_shape(*recipe);
  TrainingJob job;
  job.world = 4, job.mixed_precision = parallel::Precision::BF16;
  const StepLayout cpu = step_layout(*recipe, shape, job);
  const int64_t unit = 4001, shard = ceil_div(unit, 4);
  EXPECT_EQ(cpu.reduce_scatter(unit), unit * 2 + shard * 2 +
                                          dist::reduce_scatter_scratch_bytes(dist::CommBackend::GLOO, shard, 4, 2));
  job.device = parallel::Device::CUDA;
  const StepLayout cuda = step_layout(*recipe, shape, job);
  EXPECT_EQ(cuda.reduce_scatter(unit), unit * 2 + shard * 2);
  EXPECT_TRUE(cuda.overlap);
  EXPECT_FALSE(cpu.overlap);
}

TEST(StepPhases, BadJobsAreRefusedByName) {
  const auto recipe = models::recipe_of("bert-debug");
  const ModelShape shape = model_shape(*recipe);
  TrainingJob job;
  job.world = 3, job.nodes = 2;
  testing::expect_error<std::invalid_argument>([&] { step_layout(*recipe, shape, job); },
                                               {"a world of 3 ranks does not divide into 2 nodes"});
  job.nodes = 1, job.grad_accum = 0;
  testing::expect_error<std::invalid_argument>([&] { step_layout(*recipe, shape, job); },
                                               {"gradient accumulation of 0 micro-batches (expected >= 1)"});
  job.grad_accum = 1, job.checkpoint_every = 0;
  testing::expect_error<std::invalid_argument>([&] { step_layout(*recipe, shape, job); },
                                               {"checkpoint every 0 layers (expected >= 1)"});
}

}  // namespace
}  // namespace shardtrain::plan
