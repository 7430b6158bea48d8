// The moments of a training step where one rank's memory may peak, each a function of the step's layout
// (step_layout.h): its bytes on the device and the terms that make them up. memory_model.cpp takes the largest of
// each phase and of the step.
//
//   forward   its start (the root and what computes first gathered), the layers computing, the loss
//   backward  its start (the loss's gradients), the head's reduction, the walk down the layers (each layer's
//             backward moment by moment, then its reduction), the end (the root's and the embedding's gradients
//             and reductions)
//   step      clipping and the optimizer's temporaries
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "plan/step_layout.h"
#include "shardtrain/plan/memory_model.h"

namespace shardtrain::plan {

struct Moment {
  int64_t bytes = 0;               // the whole phase's: the layout's base (parameters, optimizer state, accumulated
                                   // gradients) included, but for the optimizer step, which counts its own
  std::vector<MemoryTerm> terms;   // what is on top of the base, in the order a reader adds them
};

// The first of the largest moments: ties go to the one listed first.
Moment largest(std::initializer_list<Moment> moments);

Moment forward_start(const StepLayout& s);
Moment forward_layers(const StepLayout& s);
Moment forward_loss(const StepLayout& s);

Moment backward_start(const StepLayout& s);
Moment head_reduction(const StepLayout& s);
// The walk down the layers also counts the parameters of units called twice a step.
struct Walk {
  Moment peak;
  int64_t parameters_called_twice = 0;
};
Walk backward_walk(const StepLayout& s);
Moment backward_end(const StepLayout& s);

Moment optimizer_step(const StepLayout& s);
// What the step allocates for a moment beside the state, wherever it runs (the host when offloaded): clipping's
// float64 copies or AdamW's temporaries, of the largest tensor.
int64_t step_temporaries(const StepLayout& s);

}  // namespace shardtrain::plan
