// The job's process group: rendezvous through c10d's TCPStore, the world communicator, and sub-groups.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/distributed/env.h"
#include "shardtrain/parallel/vocabulary.h"

namespace shardtrain::dist {

// How CUDA tensors travel. NCCL refuses two ranks on one GPU; Gloo moves CUDA tensors through host copies, so
// several ranks can share one device (tests of the multi-rank CUDA paths on a one-GPU machine).
enum class CudaBackend { NCCL, GLOO };

struct ProcessGroupOptions {
  parallel::Device device = parallel::Device::CPU;
  int device_index = -1;  // CUDA: this rank's device; -1 takes LOCAL_RANK
  CudaBackend cuda_backend = CudaBackend::NCCL;
  // A world of one normally runs every operation as a local identity. With this set it still builds its backend
  // (over an in-process store), so that one process exercises NCCL or Gloo themselves: the one-GPU tests.
  bool backend_at_world_one = false;
  // Rendezvous and every collective fail after this long (a peer that died or hangs); parallel.timeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  int gloo_threads = 2;  // Gloo worker threads per group: operations in flight at once
  // Called every wait_note_interval(timeout) while the rendezvous waits (the store does not answer yet, or ranks
  // have not arrived), with what it waits for; none: silent.
  std::function<void(const std::string&)> waiting_note;
};

// How often a waiting rendezvous says so: every 30 s, or a quarter of the timeout when that is shorter.
std::chrono::milliseconds wait_note_interval(std::chrono::milliseconds timeout);

// The device a rank of `env` computes on: the CPU, or with `cuda` cuda:(LOCAL_RANK mod the visible GPUs) — ranks
// share GPUs round-robin when a node runs more ranks than it has. Throws std::invalid_argument beginning with
// `what` ("train.device: 'cuda'") when no GPU is visible.
at::Device rank_device(bool cuda, const DistEnv& env, const std::string& what);
// The options of a group whose ranks compute on `device` (rank_device): CUDA tensors through NCCL, or through Gloo
// (host copies) when the node's ranks outnumber its GPUs, as NCCL refuses two ranks on one GPU; the other options
// their defaults.
ProcessGroupOptions group_options_for(const at::Device& device, const DistEnv& env);

// Owns the store and the backends. Cheap to copy (shared handle); the last copy tears the groups down.
class ProcessGroup {
 public:
  // World size 1 creates no store, opens no socket and needs no variable. Otherwise connects to the TCPStore at
  // MASTER_ADDR:MASTER_PORT (the launcher's, or rank 0 serves it: DistEnv::agent_store), waits until every rank has
  // arrived, and throws std::runtime_error naming the address, the rank, the missing ranks and the timeout when
  // they do not within it.
  static ProcessGroup init(const DistEnv& env, const ProcessGroupOptions& options = {});

  const DistEnv& env() const;
  int rank() const;        // world rank
  int world_size() const;  // world size
  parallel::Device device() const;
  const Communicator& world() const;

  // A communicator over the world ranks `ranks` (ascending, no duplicates). Collective over the whole job like
  // torch.distributed.new_group: every rank calls it with the same arguments in the same order; ranks outside the
  // group get nullopt. `name` appears in error messages.
  std::optional<Communicator> new_group(const std::vector<int>& ranks, const std::string& name);
  // The same over Gloo with host tensors whatever the ranks compute on: for what another thread exchanges while
  // the training groups are busy (ckpt::AsyncCheckpointer's writer), never sharing a backend with them.
  std::optional<Communicator> new_host_group(const std::vector<int>& ranks, const std::string& name);

  struct Impl;

 private:
  friend class Heartbeat;  // its own connection to the store
  std::optional<Communicator> make_subgroup(const std::vector<int>& ranks, const std::string& name, bool host);
  explicit ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace shardtrain::dist
