// Preemption (private to the train layer): SIGTERM (how Slurm and Kubernetes stop a job) and SIGINT (Ctrl-C, or
// the launcher passing either on) ask the run to stop at the end of the current step with a checkpoint, instead
// of dying mid-step. A second signal of the same kind while the first is pending ends the process at once, the
// default way.
//
// The ranks must stop at the same step (a checkpoint is collective), but a signal may reach some ranks only, or
// reach them in different steps: after every step the ranks all-reduce what they have seen (one element, MAX),
// and all stop when any has.
#pragma once

#include <signal.h>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::train {

class PreemptionWatch {
 public:
  PreemptionWatch();   // installs the handlers
  ~PreemptionWatch();  // restores the ones before
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;

  // The signal any rank of `world` has received (0: none), the same on every rank. Collective.
  int agreed_signal(const dist::Communicator& world) const;

 private:
  struct sigaction saved_[2];  // SIGTERM's and SIGINT's handlers before
};

}  // namespace shardtrain::train
