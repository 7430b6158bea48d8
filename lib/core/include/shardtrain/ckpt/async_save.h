// Checkpoints written while training goes on (checkpoint.async; PyTorch DCP's async_save): the step blocks only
// while this rank's share of the checkpoint is copied into a staging buffer — host memory, pinned when the model
// is on a GPU, kept and reused from one save to the next — and a thread of its own writes the files, the manifest
// and the rename (ckpt/checkpoint.h's format and atomicity, byte for byte the files save_checkpoint writes from a
// CPU model), agreeing with the other ranks' writers over a group nothing else uses. One save at a time: the next
// waits for the one in flight. A write that fails (a full disk) or a process that dies during one leaves the
// .partial directory, never a step-* one: the previous checkpoint stays the newest.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/distributed/communicator.h"

namespace shardtrain::ckpt {

// A save handed to the writer thread.
struct AsyncSaveStarted {
  std::string path;            // where it will be once written: <dir>/step-00000100
  int64_t staged_bytes = 0;    // this rank's share, copied
  double staged_seconds = 0;   // how long the step was blocked: planning (the finite check) and the copy
};

// A save the writer thread has finished.
struct AsyncSaveDone {
  std::string path;
  int64_t step = 0;
  double written_seconds = 0;  // from the hand-over to the rename (and `then`)
};

class AsyncCheckpointer {
 public:
  // `writers`: a group of every rank of the job that nothing else uses (dist::ProcessGroup::new_host_group), over
  // which the writer threads agree on failures and gather the manifest.
  explicit AsyncCheckpointer(dist::Communicator writers);
  // Waits for the save in flight (a write is never abandoned halfway); its failure is dropped — call wait() to
  // have it.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Plans the save as save_checkpoint does (collective over `world` and the model's groups; throws NonFiniteState or
  // CheckpointWriteFailed before anything is handed over), copies its tensors into the staging buffer, and starts
  // the writer. `then` (when given) runs on the writer thread once the checkpoint is in place, on every rank, with
  // the writers' group (pruning, and a barrier after it). Throws std::logic_error when a save is in flight: wait()
  // first. Collective.
  AsyncSaveStarted save(const std::string& dir, const TrainerState& state, const CheckpointModel& model,
                        const dist::Communicator& world,
                        std::function<void(const dist::Communicator& writers)> then = {});

  // Whether a save was started and not yet waited for (the same on every rank).
  bool in_flight() const { return pending_.valid(); }
  // Whether that save is still being written now (differs between ranks; for saying that a wait will be long).
  bool writing() const;
  // Blocks until the save in flight is written and returns it; nullopt when there was none. Rethrows its failure:
  // CheckpointWriteFailed, on every rank alike, the .partial directory removed.
  std::optional<AsyncSaveDone> wait();

  int64_t staging_bytes() const;  // the staging buffer's size: what the last save copied

 private:
  struct Staging;
  dist::Communicator writers_;
  std::unique_ptr<Staging> staging_;
  std::future<AsyncSaveDone> pending_;
};

}  // namespace shardtrain::ckpt
