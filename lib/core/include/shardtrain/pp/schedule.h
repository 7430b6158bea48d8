// Pipeline schedules as data: for each pipeline rank, the ordered list of what it computes — which stage's forward
// or backward on which microbatch — as PyTorch's torch.distributed.pipelining and Megatron-Core order them.
// Communication follows from the list: a forward's output goes to the next stage's rank, a backward's input
// gradient to the previous stage's. Stages are placed in a loop: rank r holds stages r, r + P, r + 2P, ... (P
// ranks, `stages_per_rank` each: Megatron's virtual stages).
//
//   GPIPE              every forward, then every backward                      bubble (P-1) / (M + P - 1)
//   ONE_F_ONE_B        P - 1 - r forwards, then one forward one backward,    the same bubble, at most P - r
//                      then the backwards left                                 microbatches' activations held
//   INTERLEAVED_1F1B   1F1B over the rank's v stages, microbatches in groups  (P-1) / (v M + P - 1)
//                      of P (Megatron's order; M a multiple of P)
//   ZERO_BUBBLE        ZB-H1: 1F1B's memory, each backward split into its     about a third of 1F1B's
//                      input gradient (I, sent back at once) and its weight
//                      gradient (W), the W's filling the waits
// (P ranks, M microbatches, v stages per rank; bubbles with a backward twice a forward's time, I and W a forward's.)
//
// simulate() runs a schedule's lists as ranks would and measures its bubble; it is what checks a schedule: every
// action's input produced before it runs, each action exactly once, and no ranks waiting on each other forever.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::pp {

enum class Op {
  FORWARD,          // F: the stage's forward on a microbatch; its output to the next stage
  BACKWARD,         // B: input and weight gradients; the input's to the previous stage
  BACKWARD_INPUT,   // I: the input gradient alone, to the previous stage (the weights' wait for W)
  BACKWARD_WEIGHT,  // W: the weight gradients of a microbatch whose I ran
};

struct Action {
  Op op = Op::FORWARD;
  int stage = 0;       // 0 .. stages - 1
  int microbatch = 0;  // 0 .. microbatches - 1
  bool operator==(const Action& o) const { return op == o.op && stage == o.stage && microbatch == o.microbatch; }
};

// PyTorch's notation: stage, op letter, microbatch ("1F3": stage 1's forward of microbatch 3; "0W2").
std::string to_string(const Action& action);

struct ScheduleShape {
  parallel::PipelineSchedule kind = parallel::PipelineSchedule::ONE_F_ONE_B;
  int ranks = 1;            // P, the pipeline's ranks
  int stages_per_rank = 1;  // v: more than 1 only for INTERLEAVED_1F1B
  int microbatches = 1;     // M per step
  int stages() const { return ranks * stages_per_rank; }
  int rank_of(int stage) const { return stage % ranks; }
};

struct Schedule {
  ScheduleShape shape;
  std::vector<std::vector<Action>> actions;  // by rank, in the order the rank runs them
  // Every rank's list, one line each ("rank 0: 0F0 0F1 0B0 ..."): `shardtrain train --print-schedule`.
  std::string text() const;
};

// The schedule of `shape`. Throws std::invalid_argument naming the numbers and what would work for a shape the
// kind cannot run: fewer than 1 rank or microbatch, several stages per rank outside INTERLEAVED_1F1B (or one in it),
// fewer microbatches than ranks for 1F1B, interleaving and zero bubble, microbatches not a multiple of the ranks
// for interleaving.
Schedule make_schedule(const ScheduleShape& shape);

// Each action's time, for a simulation: a backward is an input gradient then a weight gradient.
struct Costs {
  double forward = 1, backward_input = 1, backward_weight = 1;
};

struct Simulation {
  double makespan = 0;            // when the last action ends
  std::vector<double> busy;       // by rank: time spent computing
  double bubble = 0;              // 1 - (mean busy) / makespan: the share of the ranks' time spent waiting
  std::vector<int> peak_held;     // by rank: most microbatches whose forward ran and whose weight gradients did not
  std::vector<std::vector<double>> starts;  // by rank, each action's start
};

// Runs `schedule` as its ranks would, an action starting once its rank is free and its input has been produced
// (communication free). Throws std::logic_error naming the ranks, their next actions and what each waits for when
// the ranks would wait on each other forever, and naming the action when one is missing, repeated or out of order
// on its rank (a backward before its forward, W before I).
Simulation simulate(const Schedule& schedule, const Costs& costs = {});

// The schedule's own bubble figure (the table above; zero bubble: (P - 1) / (3M + P - 1), ZB-H1's with F = I = W).
double nominal_bubble(const ScheduleShape& shape);

}  // namespace shardtrain::pp
