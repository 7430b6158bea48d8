// A small multi-process demo: every rank contributes its rank to an all-reduce and an all-gather and prints what
// it got. Run it through the launcher:  build/shardtrain launch --nproc-per-node 2 -- build/allreduce_demo
#include <ATen/ATen.h>

#include <iostream>

#include "shardtrain/distributed/env.h"
#include "shardtrain/distributed/process_group.h"

int main() {
  using namespace shardtrain::dist;
  try {
    DistEnv env = read_dist_env(process_env_lookup());
    ProcessGroup pg = ProcessGroup::init(env);
    const Communicator& world = pg.world();
    at::Tensor value = at::full({4}, static_cast<double>(pg.rank() + 1), at::kFloat);
    world.all_reduce(value, ReduceOp::SUM).wait();
    at::Tensor gathered = at::empty({world.size()}, at::kFloat);
    world.all_gather(gathered, at::full({1}, static_cast<double>(pg.rank()), at::kFloat)).wait();
    const int w = world.size();
    std::cout << "rank " << pg.rank() << " of " << w << " (" << env_source_name(env.source) << ", "
              << comm_backend_name(world.backend()) << "): all_reduce(rank+1) = " << value[0].item<float>()
              << " (expected " << w * (w + 1) / 2 << "), all_gather(rank) = [";
    for (int r = 0; r < w; ++r) std::cout << (r ? ", " : "") << gathered[r].item<float>();
    std::cout << "]" << std::endl;
    world.barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "allreduce_demo: " << e.what() << std::endl;
    return 1;
  }
}
