// Strings between ranks, for the few decisions every rank must take alike from what one of them knows: the run id
// rank 0 chose, why a checkpoint failed to verify on the rank that read the damaged file. Built on the
// communicator's all_gather/broadcast of bytes (two collectives each: the lengths, then the padded bytes).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::dist {

// Every rank's `text`, indexed by rank in `group`. Collective.
std::vector<std::string> all_gather_text(const Communicator& group, const std::string& text);

// The first non-empty `text` in rank order, on every rank; "" when every rank's is empty. How ranks agree that a
// step failed somewhere: a write that failed on one rank fails the save on all, with that rank's reason (which
// names the rank: failure_text). Collective.
std::string first_failure(const Communicator& group, const std::string& text);

// What every rank of a group throws alike once it agreed on a failure (first_failure): a caller that gets one
// knows the others got it too and need not agree again.
class AgreedFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "rank R: what" for this rank of `group` (R its world rank), or "" when `what` is.
std::string failure_text(const Communicator& group, const std::string& what);

// `root`'s `text` on every rank (the others' argument is ignored). Collective.
std::string broadcast_text(const Communicator& group, const std::string& text, int root);

}  // namespace shardtrain::dist
