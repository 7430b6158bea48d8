// Strings between ranks, for the few decisions every rank must take alike from what one of them knows: the run id
// rank 0 chose, why a checkpoint failed to verify on the rank that read the damaged file. Built on the
// communicator's all_gather/broadcast of bytes (two collectives each: the lengths, then the padded bytes).
#pragma once

#include <string>
#include <vector>

#include "shardtrain/distributed/communicator.h"

namespace shardtrain::dist {

// Every rank's `text`, indexed by rank in `group`. Collective.
std::vector<std::string> all_gather_text(const Communicator& group, const std::string& text);

// `root`'s `text` on every rank (the others' argument is ignored). Collective.
std::string broadcast_text(const Communicator& group, const std::string& text, int root);

}  // namespace shardtrain::dist
