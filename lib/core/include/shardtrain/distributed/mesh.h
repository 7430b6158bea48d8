// A 2-D layout of the world for hybrid sharding: `replicate` rows of `shard` ranks, world rank = row * shard + col.
// The shard group of a rank is its row (ranks that shard parameters among themselves, normally one node), its
// replicate group is its column (ranks holding the same shard, across nodes). A 1-D mesh is replicate = 1.
//
//            shard ->          e.g. 2x2:  shard groups {0,1} {2,3}
//   replicate  0  1  ..  S-1              replicate groups {0,2} {1,3}
//      |       S ...   2S-1
#pragma once

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/distributed/process_group.h"

namespace shardtrain::dist {

class DeviceMesh {
 public:
  // shard = -1 infers world / replicate. Throws std::invalid_argument naming the sizes when
  // replicate * shard != world size, e.g. "mesh replicate(2) * shard(3) = 6 != WORLD_SIZE(4)". Collective.
  static DeviceMesh create(ProcessGroup& pg, int replicate, int shard = -1);

  int replicate_size() const { return replicate_size_; }
  int shard_size() const { return shard_size_; }
  int replicate_rank() const { return replicate_.rank(); }  // row index
  int shard_rank() const { return shard_.rank(); }          // column index

  const Communicator& world() const { return world_; }
  const Communicator& shard_group() const { return shard_; }
  const Communicator& replicate_group() const { return replicate_; }

 private:
  DeviceMesh(Communicator world, Communicator shard, Communicator replicate, int replicate_size, int shard_size)
      : world_(std::move(world)),
        shard_(std::move(shard)),
        replicate_(std::move(replicate)),
        replicate_size_(replicate_size),
        shard_size_(shard_size) {}

  Communicator world_;
  Communicator shard_;
  Communicator replicate_;
  int replicate_size_;
  int shard_size_;
};

}  // namespace shardtrain::dist
