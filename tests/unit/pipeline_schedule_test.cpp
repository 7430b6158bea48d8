// Pipeline schedules (pp/schedule.h) on their own: every kind over a grid of ranks, stages per rank and
// microbatches runs to the end in simulation (each action once, after its inputs, no ranks waiting on each other),
// its bubble is the schedule's own figure, and its memory is what the kind promises; the lists read as PyTorch's.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "shardtrain/models/pipeline_stage.h"
#include "shardtrain/pp/schedule.h"
#include "support/expect_error.h"

namespace shardtrain::pp {
namespace {

using Kind = parallel::PipelineSchedule;

ScheduleShape shape(Kind kind, int ranks, int microbatches, int stages_per_rank = 1) {
  ScheduleShape s;
  s.kind = kind, s.ranks = ranks, s.microbatches = microbatches, s.stages_per_rank = stages_per_rank;
  return s;
}

TEST(PipelineSchedule, EveryKindRunsToTheEndWithItsBubble) {
  const Costs two_to_one;  // F = I = W = 1: a backward twice a forward
  for (int P : {1, 2, 3, 4, 8}) {
    for (int M : {P, P + 1, 2 * P, 4 * P, 3 * P + 1}) {
      for (Kind kind : {Kind::GPIPE, Kind::ONE_F_ONE_B, Kind::ZERO_BUBBLE}) {
        const ScheduleShape s = shape(kind, P, M);
        SCOPED_TRACE(parallel::to_string(kind) + " P=" + std::to_string(P) + " M=" + std::to_string(M));
        const Simulation sim = simulate(make_schedule(s), two_to_one);
        if (kind == Kind::ZERO_BUBBLE) {
          // Within two units of ZB-H1's ideal 3M + P - 1, and below 1F1B's bubble.
          EXPECT_LE(sim.makespan, 3 * M + P - 1 + 2);
          if (P > 1) EXPECT_LT(sim.bubble, nominal_bubble(shape(Kind::ONE_F_ONE_B, P, M)));
          for (int r = 0; r < P; ++r) EXPECT_LE(sim.peak_held[r], P) << "rank " << r;  // 1F1B's first rank's
        } else {
          EXPECT_NEAR(sim.bubble, nominal_bubble(s), 1e-9);
          for (int r = 0; r < P; ++r) {
            // GPipe holds every microbatch; 1F1B at most P - r (the first rank the most).
            EXPECT_EQ(sim.peak_held[r], kind == Kind::GPIPE ? M : std::min(P - r, M)) << "rank " << r;
          }
        }
      }
      for (int v : {2, 3}) {
        if (M % P != 0) continue;
        const ScheduleShape s = shape(Kind::INTERLEAVED_1F1B, P, M, v);
        SCOPED_TRACE("interleaved P=" + std::to_string(P) + " M=" + std::to_string(M) + " v=" + std::to_string(v));
        const Simulation sim = simulate(make_schedule(s), two_to_one);
        EXPECT_NEAR(sim.bubble, nominal_bubble(s), 1e-9);
        EXPECT_LT(sim.bubble, nominal_bubble(shape(Kind::ONE_F_ONE_B, P, M)) + 1e-12);
      }
    }
  }
}

// The lists as `--print-schedule` shows them, in PyTorch's notation: 1F1B on 2 ranks, 3 microbatches; Megatron's
// interleaved order on 2 ranks with 2 stages each (stage s on rank s mod 2).
TEST(PipelineSchedule, ListsReadAsPyTorchWritesThem) {
  EXPECT_EQ(make_schedule(shape(Kind::ONE_F_ONE_B, 2, 3)).text(),
            "rank 0: 0F0 0F1 0B0 0F2 0B1 0B2\n"
            "rank 1: 1F0 1B0 1F1 1B1 1F2 1B2\n");
  EXPECT_EQ(make_schedule(shape(Kind::GPIPE, 2, 2)).text(), "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1F1 1B0 1B1\n");
  const Schedule interleaved = make_schedule(shape(Kind::INTERLEAVED_1F1B, 2, 2, 2));
  EXPECT_EQ(interleaved.text(),
            "rank 0: 0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1\n"
            "rank 1: 1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1\n");
  const Schedule zb = make_schedule(shape(Kind::ZERO_BUBBLE, 2, 2));
  EXPECT_EQ(zb.text(), "rank 0: 0F0 0F1 0I0 0W0 0I1 0W1\nrank 1: 1F0 1I0 1F1 1I1 1W0 1W1\n");
}

// A list out of order is found, named: a backward before its forward, a rank waiting on another that waits on it.
TEST(PipelineSchedule, BrokenListsAreNamed) {
  Schedule s = make_schedule(shape(Kind::ONE_F_ONE_B, 2, 2));
  std::swap(s.actions[1][0], s.actions[1][1]);  // 1B0 before 1F0
  testing::expect_error<std::logic_error>([&] { simulate(s); }, {"rank 1's 1B0 waits for 1F0"});
  s = make_schedule(shape(Kind::ONE_F_ONE_B, 2, 2));
  s.actions[0] = {{Op::FORWARD, 0, 0}, {Op::BACKWARD, 0, 0}, {Op::BACKWARD, 0, 1}, {Op::FORWARD, 0, 1}};
  testing::expect_error<std::logic_error>([&] { simulate(s); }, {"wait on each other forever", "rank 0's 0B1"});
  s = make_schedule(shape(Kind::GPIPE, 2, 2));
  s.actions[0].pop_back();
  testing::expect_error<std::logic_error>([&] { simulate(s); }, {"stage 0 microbatch 1"});
  s = make_schedule(shape(Kind::GPIPE, 2, 2));
  s.actions[0].push_back(s.actions[0][0]);
  testing::expect_error<std::logic_error>([&] { simulate(s); }, {"runs 0F0 twice"});
}

// Shapes a kind cannot run are refused naming the numbers and what would work.
TEST(PipelineSchedule, ShapesThatCannotRunAreRefused) {
  testing::expect_error<std::invalid_argument>([] { make_schedule(shape(Kind::ONE_F_ONE_B, 4, 3)); },
                                               {"1f1b with 4 ranks", "3 microbatches", "at least 4 microbatches"});
  testing::expect_error<std::invalid_argument>([] { make_schedule(shape(Kind::INTERLEAVED_1F1B, 4, 6, 2)); },
                                               {"a multiple of 4 (4 or 8)"});
  testing::expect_error<std::invalid_argument>([] { make_schedule(shape(Kind::ONE_F_ONE_B, 2, 4, 2)); },
                                               {"pp_stages_per_rank: 1"});
  testing::expect_error<std::invalid_argument>([] { make_schedule(shape(Kind::INTERLEAVED_1F1B, 2, 4, 1)); },
                                               {"2 or more stages per rank"});
  testing::expect_error<std::invalid_argument>([] { make_schedule(shape(Kind::GPIPE, 2, 0)); },
                                               {"at least 1 microbatch"});
  EXPECT_NO_THROW(make_schedule(shape(Kind::GPIPE, 4, 2)));  // GPipe runs with fewer microbatches than ranks
}

// Stages balanced by cost: the least largest stage, and among those the most even; the first and last stages'
// extra work (embedding; norm, head and loss) counted with their layers.
TEST(PipelineSplit, BalancedByCost) {
  auto counts = [](const std::vector<models::StageLayers>& split) {
    std::vector<int64_t> out;
    int64_t next = 0;
    for (const auto& s : split) {
      EXPECT_EQ(s.first, next);  // consecutive, covering every layer
      next += s.count;
      out.push_back(s.count);
    }
    return out;
  };
  const std::vector<double> eight(8, 1.0);
  EXPECT_EQ(counts(models::balanced_split(eight, 4)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(counts(models::balanced_split({5, 1, 1, 1, 1, 1}, 2)), (std::vector<int64_t>{1, 5}));
  // A head worth two layers: the last stage takes one layer, the rest as even as the largest allows (3, 2, 2 in
  // any order scores alike; the first found has the earlier stages shorter).
  EXPECT_EQ(counts(models::balanced_split(eight, 4, 0, 2)), (std::vector<int64_t>{2, 2, 3, 1}));
  EXPECT_EQ(counts(models::balanced_split({1, 1, 1, 1}, 2, 3, 0)), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(counts(models::balanced_split(eight, 1)), (std::vector<int64_t>{8}));
  EXPECT_THROW(models::balanced_split({1, 1, 1}, 4), std::invalid_argument);
  EXPECT_EQ(counts(models::split_layers(7, 3)), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(counts(models::split_layers(8, 3, {2, 5})), (std::vector<int64_t>{2, 3, 3}));
  EXPECT_THROW(models::split_layers(8, 3, {5, 2}), std::invalid_argument);
}

}  // namespace
}  // namespace shardtrain::pp
