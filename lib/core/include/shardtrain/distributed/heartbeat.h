// Finding the rank that hangs. A rank that stops (SIGSTOP, a frozen machine, a process swapped out) leaves the others
// waiting in their next collective until its timeout, which then names the waiting rank, not the stuck one. With a
// Heartbeat, every rank's thread bumps a counter in the job's store every `interval` and publishes what the rank is
// doing ("step 12"); each rank watches the next one in the ring (rank r watches r + 1 mod W), and when that rank's
// counter has not moved for `stale_after`, calls `on_stuck` with a message naming it, what it last said it was
// doing, and what this rank is doing. A rank that ended normally says so first and is not reported.
//
// The store calls run on a thread of their own with a connection of their own (TCPStore::clone), so a main thread
// blocked in the store (a rendezvous) does not hold the beats back; the watching thread waits for each call at most
// `stale_after`. When the calls never return, whoever serves the store is stuck: the launcher (DistEnv::agent_store;
// a stopped rank 0 is then found by its watcher like any other), or rank 0 when it serves the store itself (mpirun,
// srun). World size 1: nothing runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shardtrain/distributed/process_group.h"

namespace shardtrain::dist {

struct HeartbeatOptions {
  std::chrono::milliseconds interval{2000};     // between beats (and checks of the watched rank)
  std::chrono::milliseconds stale_after{60000}; // no beat for this long: the watched rank is stuck
};

// Options for a collective timeout of `timeout`: beats every timeout/20 (0.5-10 s), stuck after a quarter of the
// timeout (at least 4 beats, at most 2 minutes) — a stopped rank is named well before the collectives time out.
HeartbeatOptions heartbeat_options_for(std::chrono::milliseconds timeout);

class Heartbeat {
 public:
  // `on_stuck` runs on the heartbeat thread, once.
  Heartbeat(const ProcessGroup& pg, HeartbeatOptions options, std::function<void(const std::string&)> on_stuck);
  ~Heartbeat();  // publishes "finished" and stops the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // What this rank is doing, published with its next beat ("step 12", "checkpoint at step 12").
  void set_activity(const std::string& activity);

  // Every rank's last published activity, grouped ("ranks 0, 2-3: step 12; rank 1: step 11"). Reads the store,
  // waiting at most `stale_after`.
  std::string describe_ranks() const;

 private:
  void watch();

  struct StoreThread;  // the store connection and the thread that calls it (heartbeat.cpp)
  std::shared_ptr<StoreThread> store_;
  int rank_ = 0, world_ = 1;
  std::string store_host_;  // who serves the store: "rank 0", or "the launcher at HOST:PORT"
  HeartbeatOptions options_;
  std::function<void(const std::string&)> on_stuck_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string activity_ = "starting";
  bool activity_changed_ = true, stopping_ = false;
  std::thread watcher_;
};

}  // namespace shardtrain::dist
