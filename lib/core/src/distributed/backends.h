// Construction of the c10d Gloo backend (private to the dist layer), apart because its headers need gloo/ (Debian's
// libgloo-dev). NCCL's is made in libshardtrain_cuda.so (cuda/entry_points.h).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace shardtrain::dist {

// Gloo over TCP. `hostname` picks the interface: loopback for single-node jobs; GLOO_SOCKET_IFNAME, when set,
// names the interface instead (as in torch.distributed).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, const std::string& hostname,
                                                    int threads);

}  // namespace shardtrain::dist
