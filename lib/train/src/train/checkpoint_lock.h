// One live run per checkpoint directory (private to the train layer). Two runs writing one checkpoint.dir destroy
// each other's work — one's save renames over the other's, its prune removes the other's partial saves, a resume
// takes the other's run id — so a run holds <checkpoint.dir>/run.lock from before it looks at the checkpoints
// until it ends: rank 0 takes an flock(2) on it (released by the kernel however the process ends) and writes who
// holds it. A second run, with --resume or without, is refused naming the holder; a note left by a run that died
// holding the lock is reported and taken over. Shared file systems need flock across hosts (NFSv4 and Lustre with
// -o flock have it).
#pragma once

#include <memory>
#include <string>

#include "shardtrain/distributed/communicator.h"
#include "shardtrain/io/files.h"
#include "shardtrain/log/log.h"

namespace shardtrain::train {

class CheckpointLock {
 public:
  // Takes `dir`/run.lock on rank 0 (making `dir`) for the caller's lifetime; every rank throws
  // std::invalid_argument alike when another live run holds it, naming its host, pid, run id and start. An empty
  // `dir` (no checkpoints) takes nothing. Collective.
  CheckpointLock(const std::string& dir, const dist::Communicator& world, const log::Logger& logger);
  // Released: the holder's note is cleared, then the lock (a note left behind says its holder died).
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  // Records the run id in the holder's note, once the run knows it (a fresh run's is chosen after the lock).
  void set_run(const std::string& run_id);

  static std::string file_of(const std::string& dir) { return dir + "/run.lock"; }

 private:
  std::unique_ptr<io::FileLock> lock_;  // rank 0, when dir is set
  std::string started_;                 // "host H pid P since T", the note's lasting part
};

}  // namespace shardtrain::train
