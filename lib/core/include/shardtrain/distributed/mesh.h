// The layout of the world: `pp` pipeline stages (outermost), each of `replicate` rows of `shard` data-parallel ranks
// (hybrid sharding), each of them `tp` ranks that split its layers (tensor parallelism), the tensor dimension
// innermost (the ranks of one node, as torchtitan and Megatron place it):
//
//   world rank = ((p * replicate + row) * shard + col) * tp + t
//
// Every group below but the pipeline's lies within one pipeline index p; the pipeline group of a rank is the pp
// ranks with its (row, col, t), one per stage, in stage order.
// The shard group of a rank is the ranks of its row with its t (they shard parameters among themselves, normally
// one node), its replicate group the ranks of its column with its t (the same shard across nodes), its
// tensor-parallel group the tp ranks of its (row, col), and its data-parallel group every rank with its t (the
// ranks that see different batches: replicate * shard of them). With tp = 1 the data-parallel group is the world;
// a 1-D mesh is replicate = 1, tp = 1.
//
//            shard ->          e.g. 2x2:  shard groups {0,1} {2,3}
//   replicate  0  1  ..  S-1              replicate groups {0,2} {1,3}
//      |       S ...   2S-1    1x2, tp 2: shard groups {0,2} {1,3}, tensor-parallel groups {0,1} {2,3}
#pragma once

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/distributed/process_group.h"

namespace shardtrain::dist {

class DeviceMesh {
 public:
  // shard = -1 infers world / (replicate * tp). Throws std::invalid_argument naming the sizes when
  // replicate * shard * tp != world size, e.g. "mesh replicate(2) * shard(3) * tp(1) = 6 != WORLD_SIZE(4)".
  // Collective.
  static DeviceMesh create(ProcessGroup& pg, int replicate, int shard = -1, int tp = 1, int pp = 1);

  int replicate_size() const { return replicate_size_; }
  int shard_size() const { return shard_size_; }
  int tp_size() const { return tp_.size(); }
  int data_size() const { return data_.size(); }            // replicate * shard
  int replicate_rank() const { return replicate_.rank(); }  // row index
  int shard_rank() const { return shard_.rank(); }          // column index
  int tp_rank() const { return tp_.rank(); }
  int data_rank() const { return data_.rank(); }            // row * shard + col: which batches this rank reads
  int pp_size() const { return pp_.size(); }
  int pp_rank() const { return pp_.rank(); }                // p: the pipeline stage(s) this rank runs

  const Communicator& world() const { return world_; }
  const Communicator& shard_group() const { return shard_; }
  const Communicator& replicate_group() const { return replicate_; }
  const Communicator& tp_group() const { return tp_; }
  const Communicator& data_group() const { return data_; }
  const Communicator& pp_group() const { return pp_; }

 private:
  struct Groups {
    Communicator world, shard, replicate, tp, data, pp;
  };
  DeviceMesh(Groups groups, int replicate_size, int shard_size)
      : world_(std::move(groups.world)),
        shard_(std::move(groups.shard)),
        replicate_(std::move(groups.replicate)),
        tp_(std::move(groups.tp)),
        data_(std::move(groups.data)),
        pp_(std::move(groups.pp)),
        replicate_size_(replicate_size),
        shard_size_(shard_size) {}

  Communicator world_;
  Communicator shard_;
  Communicator replicate_;
  Communicator tp_;
  Communicator data_;
  Communicator pp_;
  int replicate_size_;
  int shard_size_;
};

}  // namespace shardtrain::dist
