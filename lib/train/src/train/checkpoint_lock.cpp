#include "train/checkpoint_lock.h"

#include <unistd.h>

#include <ctime>
#include <stdexcept>

#include "shardtrain/distributed/text_exchange.h"

namespace shardtrain::train {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

CheckpointLock::CheckpointLock(const std::string& dir, const dist::Communicator& world, const log::Logger& logger) {
  if (dir.empty()) return;
  std::string refusal, taken_over;  // rank 0's verdict, then everyone's
  if (world.rank() == 0) {
    try {
      io::make_directories(dir);
      auto lock = std::make_unique<io::FileLock>(file_of(dir));
      if (!lock->try_lock()) {
        const std::string holder = lock->read_note();
        refusal = "checkpoint.dir: '" + dir + "' belongs to a run that is still going (" +
                  (holder.empty() ? "it has not said who it is yet" : holder) + "; " + file_of(dir) +
                  "): two runs in one directory would destroy each other's checkpoints. Wait for it to end, or " +
                  "write this run elsewhere with --checkpoint.dir=DIR";
      } else {
        taken_over = lock->read_note();
        started_ = "host " + host_name() + " pid " + std::to_string(::getpid()) + " since " + utc_now();
        lock->write_note(started_);
        lock_ = std::move(lock);
      }
    } catch (const std::runtime_error& e) {
      refusal = e.what();
    }
  }
  refusal = dist::broadcast_text(world, refusal, 0);
  if (!refusal.empty()) throw std::invalid_argument(refusal);
  if (!taken_over.empty()) {
    logger.info("checkpoint.dir: " + file_of(dir) + " was left by a run that ended without releasing it (" +
                taken_over + "); this run takes it over");
  }
}

CheckpointLock::~CheckpointLock() {
  if (!lock_) return;
  try {
    lock_->write_note("");
  } catch (const std::runtime_error&) {
    // a note that stays only makes the next run say it took the lock over
  }
}

void CheckpointLock::set_run(const std::string& run_id) {
  if (lock_) lock_->write_note("run " + run_id + ", " + started_);
}

}  // namespace shardtrain::train
