#include "shardtrain/distributed/mesh.h"

#include <stdexcept>
#include <string>

namespace shardtrain::dist {

DeviceMesh DeviceMesh::create(ProcessGroup& pg, int replicate, int shard) {
  const int world = pg.world_size();
  if (replicate < 1) {
    throw std::invalid_argument("mesh replicate(" + std::to_string(replicate) + ") must be at least 1");
  }
  if (shard == -1) {
    if (world % replicate != 0) {
      throw std::invalid_argument("mesh replicate(" + std::to_string(replicate) + ") does not divide WORLD_SIZE(" +
                                  std::to_string(world) + ")");
    }
    shard = world / replicate;
  }
  if (shard < 1 || replicate * shard != world) {
    throw std::invalid_argument("mesh replicate(" + std::to_string(replicate) + ") * shard(" + std::to_string(shard) +
                                ") = " + std::to_string(replicate * shard) + " != WORLD_SIZE(" +
                                std::to_string(world) + ")");
  }
  // Every rank creates every group in the same order (new_group is collective); each keeps the two it is in.
  std::optional<Communicator> my_shard, my_replicate;
  for (int row = 0; row < replicate; ++row) {
    std::vector<int> ranks;
    for (int col = 0; col < shard; ++col) ranks.push_back(row * shard + col);
    if (auto g = pg.new_group(ranks, "shard[" + std::to_string(row) + "]")) my_shard = std::move(g);
  }
  for (int col = 0; col < shard; ++col) {
    std::vector<int> ranks;
    for (int row = 0; row < replicate; ++row) ranks.push_back(row * shard + col);
    if (auto g = pg.new_group(ranks, "replicate[" + std::to_string(col) + "]")) my_replicate = std::move(g);
  }
  return DeviceMesh(pg.world(), *my_shard, *my_replicate, replicate, shard);
}

}  // namespace shardtrain::dist
