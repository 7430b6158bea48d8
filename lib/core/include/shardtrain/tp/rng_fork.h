// Random numbers inside tensor parallelism's split regions (Megatron-LM's model-parallel RNG tracker): the ranks of
// a tensor-parallel group draw alike where their activations are replicated (a dropout mask there must be the same
// on every rank), but where each holds its own part — its attention heads, its slice of the MLP's width, under
// sequence parallelism its slice of the tokens — equal draws would give every rank's part the same mask. For the
// life of an RngFork the default generator of a device draws a stream of this rank's own; afterwards it continues
// alike on every rank of the group.
//
// Both streams are derived from the generator's state when the fork begins (equal on the ranks of the group, which
// are seeded alike and draw alike outside forks): this rank's from that state and the rank, the continuation from
// the state alone. So activation checkpointing, which replays a forward from the generator states it saved, replays
// each fork's draws too (nn/activation_checkpoint.h), with no state of the fork's own to save.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace shardtrain::tp {

class RngFork {
 public:
  RngFork(c10::Device device, int64_t rank);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  at::Generator generator_;
  uint64_t origin_;  // a hash of the generator's state when the fork began
};

}  // namespace shardtrain::tp
