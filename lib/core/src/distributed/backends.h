// Construction of the c10d backends (private to the dist layer). Gloo and NCCL live in separate translation units
// because their headers differ: Gloo's need gloo/ (Debian's libgloo-dev), NCCL's need the CUDA runtime and nccl.h.
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

// NCCL on CUDA device `device_index` (made current first). Throws when CUDA is not available at run time.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, int device_index);

}  // namespace shardtrain::dist
