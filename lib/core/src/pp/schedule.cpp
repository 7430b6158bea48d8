#include "shardtrain/pp/schedule.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace shardtrain::pp {
namespace {

using Kind = parallel::PipelineSchedule;

std::string shape_text(const ScheduleShape& s) {
  return parallel::to_string(s.kind) + " with " + std::to_string(s.ranks) + " ranks, " +
         std::to_string(s.stages_per_rank) + " stage(s) per rank and " + std::to_string(s.microbatches) +
         " microbatches";
}

void check_shape(const ScheduleShape& s) {
  auto refuse = [&](const std::string& why) { throw std::invalid_argument(shape_text(s) + ": " + why); };
  if (s.ranks < 1) refuse("a pipeline needs at least 1 rank");
  if (s.microbatches < 1) refuse("a step needs at least 1 microbatch");
  if (s.stages_per_rank < 1) refuse("a rank holds at least 1 stage");
  const bool interleaved = s.kind == Kind::INTERLEAVED_1F1B;
  if (!interleaved && s.stages_per_rank != 1) {
    refuse("several stages per rank are interleaved_1f1b's (pp_stages_per_rank: 1 here, or pp_schedule: "
           "interleaved_1f1b)");
  }
  if (interleaved && s.stages_per_rank < 2) {
    refuse("interleaving needs 2 or more stages per rank (pp_stages_per_rank), else it is 1f1b");
  }
  if (s.kind != Kind::GPIPE && s.microbatches < s.ranks) {
    refuse("fewer microbatches than ranks leaves ranks with nothing to overlap: give at least " +
           std::to_string(s.ranks) + " microbatches, or gpipe");
  }
  if (interleaved && s.microbatches % s.ranks != 0) {
    const int up = (s.microbatches / s.ranks + 1) * s.ranks;
    refuse("interleaving runs microbatches in groups of the ranks: give a multiple of " + std::to_string(s.ranks) +
           " (" + std::to_string(up - s.ranks) + " or " + std::to_string(up) + ")");
  }
}

std::vector<Action> gpipe(const ScheduleShape& s, int rank) {
  std::vector<Action> out;
  for (int m = 0; m < s.microbatches; ++m) out.push_back({Op::FORWARD, rank, m});
  for (int m = 0; m < s.microbatches; ++m) out.push_back({Op::BACKWARD, rank, m});
  return out;
}

// Warm-up forwards, then a forward and a backward in turn, then the backwards left: `forwards` and `backwards` in
// the order each is run, `warmup` of the forwards first.
std::vector<Action> one_f_one_b(const std::vector<Action>& forwards, const std::vector<Action>& backwards,
                                size_t warmup) {
  std::vector<Action> out(forwards.begin(), forwards.begin() + static_cast<long>(warmup));
  size_t b = 0;
  for (size_t f = warmup; f < forwards.size(); ++f) out.push_back(forwards[f]), out.push_back(backwards[b++]);
  for (; b < backwards.size(); ++b) out.push_back(backwards[b]);
  return out;
}

std::vector<Action> plain_1f1b(const ScheduleShape& s, int rank) {
  std::vector<Action> forwards, backwards;
  for (int m = 0; m < s.microbatches; ++m) {
    forwards.push_back({Op::FORWARD, rank, m});
    backwards.push_back({Op::BACKWARD, rank, m});
  }
  return one_f_one_b(forwards, backwards, static_cast<size_t>(std::min(s.ranks - 1 - rank, s.microbatches)));
}

// Megatron's interleaved order: the k-th forward of a rank is chunk (k / P) mod v of microbatch (k / (P v)) P +
// k mod P — P microbatches through one of its stages, then the same P through its next — and backwards the same
// with the chunks from the last; P - 1 - r forwards twice over, and (v - 1) P more, warm the pipeline up.
std::vector<Action> interleaved(const ScheduleShape& s, int rank) {
  const int P = s.ranks, v = s.stages_per_rank, total = s.microbatches * v;
  std::vector<Action> forwards, backwards;
  for (int k = 0; k < total; ++k) {
    const int group = k / (P * v), chunk = (k / P) % v, m = group * P + k % P;
    forwards.push_back({Op::FORWARD, chunk * P + rank, m});
    backwards.push_back({Op::BACKWARD, (v - 1 - chunk) * P + rank, m});
  }
  const int warmup = std::min((P - rank - 1) * 2 + (v - 1) * P, total);
  return one_f_one_b(forwards, backwards, static_cast<size_t>(warmup));
}

// ZB-H1 by list scheduling with F = I = W = 1, every rank deciding when it is free: a forward while fewer than P
// microbatches are held (1F1B's peak, its first rank's) or an input gradient whose output gradient has arrived —
// the ranks from `input_first` on taking the input gradient first (it unblocks the rank before), the others the
// forward (it unblocks the next) — else the oldest weight gradient waiting: the W's fall into what would be waits.
// Returns the lists and when the last action ends.
std::pair<std::vector<std::vector<Action>>, double> zero_bubble_with(const ScheduleShape& s, int input_first) {
  const int P = s.ranks, M = s.microbatches;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<std::vector<Action>> out(static_cast<size_t>(P));
  std::vector<double> clock(static_cast<size_t>(P), 0);
  // Per (stage, microbatch): when its forward's output and its input gradient are available (kNever: not yet).
  std::vector<std::vector<double>> forward_done(P, std::vector<double>(M, kNever)), input_done = forward_done;
  std::vector<int> next_forward(P, 0), next_input(P, 0), held(P, 0);
  std::vector<std::deque<int>> waiting_weights(static_cast<size_t>(P));
  auto act = [&](int r, double now) {
    const int fi = next_forward[r], ii = next_input[r];
    const bool input_ready = ii < M && forward_done[r][ii] <= now &&
                             (r == P - 1 || input_done[r + 1][ii] <= now);
    const bool forward_ready = fi < M && held[r] < P && (r == 0 || forward_done[r - 1][fi] <= now);
    if (input_ready && (r >= input_first || !forward_ready)) {
      out[r].push_back({Op::BACKWARD_INPUT, r, ii});
      input_done[r][ii] = now + 1, waiting_weights[r].push_back(ii), ++next_input[r];
    } else if (forward_ready) {
      out[r].push_back({Op::FORWARD, r, fi});
      forward_done[r][fi] = now + 1, ++held[r], ++next_forward[r];
    } else if (!waiting_weights[r].empty()) {
      out[r].push_back({Op::BACKWARD_WEIGHT, r, waiting_weights[r].front()});
      waiting_weights[r].pop_front(), --held[r];
    } else {
      return false;
    }
    clock[r] = now + 1;
    return true;
  };
  // One decision at the earliest time any rank is free: the first such rank that can act does; when none can,
  // they all wait for the next production elsewhere.
  for (int left = 3 * P * M; left > 0;) {
    const double now = *std::min_element(clock.begin(), clock.end());
    bool acted = false;
    for (int r = 0; r < P && !acted; ++r) acted = clock[r] == now && act(r, now);
    if (acted) {
      --left;
      continue;
    }
    double next = kNever;  // the earliest production after `now` anywhere
    for (int q = 0; q < P; ++q) {
      if (clock[q] > now) next = std::min(next, clock[q]);
    }
    if (next == kNever) throw std::logic_error("zero_bubble: no rank can proceed (" + shape_text(s) + ")");
    for (int q = 0; q < P; ++q) {
      if (clock[q] == now) clock[q] = next;
    }
  }
  return {out, *std::max_element(clock.begin(), clock.end())};
}

// The best of the list schedules above over where the ranks switch to input gradients first: within a unit or two
// of ZB-H1's ideal 3M + P - 1 (checked by the tests over a grid).
std::vector<std::vector<Action>> zero_bubble(const ScheduleShape& s) {
  std::pair<std::vector<std::vector<Action>>, double> best = zero_bubble_with(s, 0);
  for (int k = 1; k <= s.ranks; ++k) {
    auto candidate = zero_bubble_with(s, k);
    if (candidate.second < best.second) best = std::move(candidate);
  }
  return best.first;
}

char letter(Op op) {
  switch (op) {
    case Op::FORWARD: return 'F';
    case Op::BACKWARD: return 'B';
    case Op::BACKWARD_INPUT: return 'I';
    case Op::BACKWARD_WEIGHT: return 'W';
  }
  return '?';
}

}  // namespace

std::string to_string(const Action& a) {
  return std::to_string(a.stage) + letter(a.op) + std::to_string(a.microbatch);
}

std::string Schedule::text() const {
  std::string out;
  for (size_t r = 0; r < actions.size(); ++r) {
    out += "rank " + std::to_string(r) + ":";
    for (const Action& a : actions[r]) out += " " + to_string(a);
    out += "\n";
  }
  return out;
}

Schedule make_schedule(const ScheduleShape& shape) {
  check_shape(shape);
  Schedule s{shape, {}};
  if (shape.kind == Kind::ZERO_BUBBLE) {
    s.actions = zero_bubble(shape);
    return s;
  }
  for (int r = 0; r < shape.ranks; ++r) {
    switch (shape.kind) {
      case Kind::GPIPE: s.actions.push_back(gpipe(shape, r)); break;
      case Kind::ONE_F_ONE_B: s.actions.push_back(plain_1f1b(shape, r)); break;
      case Kind::INTERLEAVED_1F1B: s.actions.push_back(interleaved(shape, r)); break;
      case Kind::ZERO_BUBBLE: break;
    }
  }
  return s;
}

namespace {

// What one (stage, microbatch) has done so far in a simulation, and when.
struct Progress {
  double forward = -1, input = -1, weight = -1;  // end times; -1: not yet
};

// What `a` still waits for (the action that produces its input), or "" when everything it needs has run; when it
// can start is the caller's (the latest of its rank's clock and its inputs' end times).
std::string missing(const Action& a, const std::vector<std::vector<Progress>>& p, int stages) {
  const Progress& own = p[a.stage][a.microbatch];
  switch (a.op) {
    case Op::FORWARD:
      return a.stage > 0 && p[a.stage - 1][a.microbatch].forward < 0 ? to_string({Op::FORWARD, a.stage - 1,
                                                                                  a.microbatch})
                                                                       : "";
    case Op::BACKWARD:
    case Op::BACKWARD_INPUT:
      if (own.forward < 0) return to_string({Op::FORWARD, a.stage, a.microbatch});
      return a.stage + 1 < stages && p[a.stage + 1][a.microbatch].input < 0
                 ? "the input gradient of " + std::to_string(a.stage + 1) + "*" + std::to_string(a.microbatch)
                 : "";
    case Op::BACKWARD_WEIGHT:
      return own.input < 0 ? to_string({Op::BACKWARD_INPUT, a.stage, a.microbatch}) : "";
  }
  return "";
}

// Checks that each rank's list holds each of its stages' microbatches once per kind of action, of one backward
// style (B, or I and W).
void check_complete(const Schedule& s) {
  const ScheduleShape& shape = s.shape;
  if (static_cast<int>(s.actions.size()) != shape.ranks) {
    throw std::logic_error("the schedule has " + std::to_string(s.actions.size()) + " ranks' lists, its shape " +
                           std::to_string(shape.ranks));
  }
  std::map<std::tuple<int, int, int>, int> seen;  // (op, stage, microbatch) -> times
  for (int r = 0; r < shape.ranks; ++r) {
    for (const Action& a : s.actions[r]) {
      if (a.stage < 0 || a.stage >= shape.stages() || a.microbatch < 0 || a.microbatch >= shape.microbatches ||
          shape.rank_of(a.stage) != r) {
        throw std::logic_error("rank " + std::to_string(r) + "'s " + to_string(a) + ": not a stage and microbatch "
                               "of this rank");
      }
      if (++seen[{static_cast<int>(a.op), a.stage, a.microbatch}] > 1) {
        throw std::logic_error("rank " + std::to_string(r) + " runs " + to_string(a) + " twice");
      }
    }
  }
  for (int st = 0; st < shape.stages(); ++st) {
    for (int m = 0; m < shape.microbatches; ++m) {
      auto count = [&](Op op) { return seen[{static_cast<int>(op), st, m}]; };
      const bool whole = count(Op::BACKWARD) == 1 && count(Op::BACKWARD_INPUT) == 0 && count(Op::BACKWARD_WEIGHT) == 0;
      const bool split = count(Op::BACKWARD) == 0 && count(Op::BACKWARD_INPUT) == 1 && count(Op::BACKWARD_WEIGHT) == 1;
      if (count(Op::FORWARD) != 1 || !(whole || split)) {
        throw std::logic_error("stage " + std::to_string(st) + " microbatch " + std::to_string(m) +
                               ": needs one forward and one backward (B, or I and W) in its rank's list");
      }
    }
  }
}

}  // namespace

Simulation simulate(const Schedule& s, const Costs& costs) {
  check_complete(s);
  const ScheduleShape& shape = s.shape;
  const int P = shape.ranks, stages = shape.stages();
  std::vector<std::vector<Progress>> progress(stages, std::vector<Progress>(shape.microbatches));
  std::vector<size_t> next(P, 0);
  std::vector<double> clock(P, 0);
  Simulation sim;
  sim.busy.assign(P, 0), sim.peak_held.assign(P, 0), sim.starts.assign(P, {});
  std::vector<int> held(P, 0);
  while (true) {
    bool moved = false, done = true;
    for (int r = 0; r < P; ++r) {
      while (next[r] < s.actions[r].size()) {
        done = false;
        const Action& a = s.actions[r][next[r]];
        if (!missing(a, progress, stages).empty()) break;
        Progress& own = progress[a.stage][a.microbatch];
        double ready = clock[r], cost = 0;
        switch (a.op) {
          case Op::FORWARD:
            if (a.stage > 0) ready = std::max(ready, progress[a.stage - 1][a.microbatch].forward);
            cost = costs.forward;
            break;
          case Op::BACKWARD:
          case Op::BACKWARD_INPUT:
            if (a.stage + 1 < stages) ready = std::max(ready, progress[a.stage + 1][a.microbatch].input);
            cost = a.op == Op::BACKWARD ? costs.backward_input + costs.backward_weight : costs.backward_input;
            break;
          case Op::BACKWARD_WEIGHT:
            cost = costs.backward_weight;
            break;
        }
        sim.starts[r].push_back(ready);
        clock[r] = ready + cost, sim.busy[r] += cost;
        if (a.op == Op::FORWARD) own.forward = clock[r], sim.peak_held[r] = std::max(sim.peak_held[r], ++held[r]);
        if (a.op == Op::BACKWARD || a.op == Op::BACKWARD_INPUT) own.input = clock[r];
        if (a.op == Op::BACKWARD || a.op == Op::BACKWARD_WEIGHT) own.weight = clock[r], --held[r];
        ++next[r], moved = true;
      }
    }
    if (done) break;
    if (!moved) {
      std::string stuck;
      for (int r = 0; r < P; ++r) {
        if (next[r] >= s.actions[r].size()) continue;
        const Action& a = s.actions[r][next[r]];
        stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + "'s " + to_string(a) +
                 " waits for " + missing(a, progress, stages);
      }
      throw std::logic_error(shape_text(shape) + ": the ranks wait on each other forever (" + stuck + ")");
    }
  }
  for (int r = 0; r < P; ++r) sim.makespan = std::max(sim.makespan, clock[r]);
  double busy = 0;
  for (double b : sim.busy) busy += b;
  sim.bubble = sim.makespan > 0 ? 1 - busy / P / sim.makespan : 0;
  return sim;
}

double nominal_bubble(const ScheduleShape& s) {
  const double P = s.ranks, M = s.microbatches, v = s.stages_per_rank;
  switch (s.kind) {
    case Kind::GPIPE:
    case Kind::ONE_F_ONE_B: return (P - 1) / (M + P - 1);
    case Kind::INTERLEAVED_1F1B: return (P - 1) / (v * M + P - 1);
    case Kind::ZERO_BUBBLE: return (P - 1) / (3 * M + P - 1);
  }
  return 0;
}

}  // namespace shardtrain::pp
