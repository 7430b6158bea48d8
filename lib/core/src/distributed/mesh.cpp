#include "shardtrain/distributed/mesh.h"

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace shardtrain::dist {

namespace {

std::string sizes_text(int pp, int replicate, int shard, int tp) {
  return std::string("mesh ") + (pp > 1 ? "pp(" + std::to_string(pp) + ") * " : "") + "replicate(" +
         std::to_string(replicate) + ") * shard(" + std::to_string(shard) + ") * tp(" + std::to_string(tp) + ")";
}

// Creates one group per value of `key` (ranks of equal key, in rank order; every rank creates every group in the
// same order, new_group being collective) and returns the one this rank is in.
Communicator group_by(ProcessGroup& pg, int groups, const std::function<int(int)>& key, const std::string& name) {
  std::optional<Communicator> mine;
  for (int g = 0; g < groups; ++g) {
    std::vector<int> ranks;
    for (int r = 0; r < pg.world_size(); ++r) {
      if (key(r) == g) ranks.push_back(r);
    }
    if (auto made = pg.new_group(ranks, name + "[" + std::to_string(g) + "]")) mine = std::move(made);
  }
  return *mine;
}

}  // namespace

DeviceMesh DeviceMesh::create(ProcessGroup& pg, int replicate, int shard, int tp, int pp) {
  const int world = pg.world_size();
  if (replicate < 1) {
    throw std::invalid_argument("mesh replicate(" + std::to_string(replicate) + ") must be at least 1");
  }
  if (tp < 1) throw std::invalid_argument("mesh tp(" + std::to_string(tp) + ") must be at least 1");
  if (pp < 1) throw std::invalid_argument("mesh pp(" + std::to_string(pp) + ") must be at least 1");
  if (shard == -1) {
    if (world % (replicate * tp * pp) != 0) {
      throw std::invalid_argument("mesh pp(" + std::to_string(pp) + ") * replicate(" + std::to_string(replicate) +
                                  ") * tp(" + std::to_string(tp) + ") does not divide WORLD_SIZE(" +
                                  std::to_string(world) + ")");
    }
    shard = world / (replicate * tp * pp);
  }
  if (shard < 1 || pp * replicate * shard * tp != world) {
    throw std::invalid_argument(sizes_text(pp, replicate, shard, tp) + " = " +
                                std::to_string(pp * replicate * shard * tp) + " != WORLD_SIZE(" +
                                std::to_string(world) + ")");
  }
  // rank = ((p * replicate + row) * shard + col) * tp + t; a stage's ranks are `stage` consecutive ones.
  const int stage = replicate * shard * tp;
  auto p = [&](int r) { return r / stage; };
  auto row = [&](int r) { return r % stage / tp / shard; };
  auto col = [&](int r) { return r % stage / tp % shard; };
  auto t = [&](int r) { return r % tp; };
  Groups groups{pg.world(),
                group_by(pg, pp * replicate * tp, [&](int r) { return (p(r) * replicate + row(r)) * tp + t(r); },
                         "shard"),
                group_by(pg, pp * shard * tp, [&](int r) { return (p(r) * shard + col(r)) * tp + t(r); }, "replicate"),
                tp == 1 ? Communicator::single(pg.rank()) : group_by(pg, world / tp, [&](int r) { return r / tp; }, "tp"),
                pg.world(),
                pp == 1 ? Communicator::single(pg.rank())
                        : group_by(pg, stage, [&](int r) { return r % stage; }, "pp")};
  if (tp > 1 || pp > 1) {
    groups.data = replicate == 1 ? groups.shard
                                 : group_by(pg, pp * tp, [&](int r) { return p(r) * tp + t(r); }, "data");
  }
  return DeviceMesh(std::move(groups), replicate, shard);
}

}  // namespace shardtrain::dist
