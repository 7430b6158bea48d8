#include "shardtrain/distributed/heartbeat.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <deque>
#include <future>
#include <map>
#include <optional>

#include "distributed/process_group_impl.h"
#include "shardtrain/util/seconds_text.h"

namespace shardtrain::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kEnded = "ended";  // the activity a rank publishes when its Heartbeat goes

std::string beat_key(int rank) { return "shardtrain/heartbeat/" + std::to_string(rank); }
std::string activity_key(int rank) { return "shardtrain/activity/" + std::to_string(rank); }

using util::seconds_text;

// "0, 2-3, 5"
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return out;
}

std::optional<std::string> get_if_set(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  const std::vector<uint8_t> bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

// The store connection and the one thread that calls it, shared (not owned) by the Heartbeat: a call that never
// returns (rank 0 stopped) leaves this thread behind, detached, holding only this.
struct Heartbeat::StoreThread {
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<WaitBoard> waits;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::function<void()>> jobs;
  bool stopping = false;
  std::promise<void> finished;

  static void run(std::shared_ptr<StoreThread> self) {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(self->mutex);
        self->wake.wait(lock, [&] { return self->stopping || !self->jobs.empty(); });
        if (self->jobs.empty()) break;
        job = std::move(self->jobs.front());
        self->jobs.pop_front();
      }
      job();
    }
    self->finished.set_value();
  }

  // Runs `call` on the store thread; its result, or nullopt when it did not return within `limit`. Rethrows what
  // the call threw (a closed connection).
  template <class R>
  std::optional<R> ask(std::function<R(c10d::Store&)> call, milliseconds limit) {
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> result = promise->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex);
      jobs.push_back([this, call, promise] {
        try {
          promise->set_value(call(*store));
        } catch (...) {
          promise->set_exception(std::current_exception());
        }
      });
    }
    wake.notify_one();
    if (result.wait_for(limit) != std::future_status::ready) return std::nullopt;
    return result.get();
  }

  std::string waiting() {
    std::lock_guard<std::mutex> lock(waits->mutex);
    return waits->waiting;
  }
};

HeartbeatOptions heartbeat_options_for(milliseconds timeout) {
  HeartbeatOptions o;
  o.interval = std::clamp(timeout / 20, milliseconds(500), milliseconds(10000));
  o.stale_after = std::clamp(timeout / 4, 4 * o.interval, std::max(4 * o.interval, milliseconds(120000)));
  return o;
}

Heartbeat::Heartbeat(const ProcessGroup& pg, HeartbeatOptions options, std::function<void(const std::string&)> on_stuck)
    : rank_(pg.rank()),
      world_(pg.world_size()),
      store_host_(pg.env().agent_store ? "the launcher at " + pg.env().master_addr + ":" +
                                             std::to_string(pg.env().master_port)
                                       : "rank 0"),
      options_(options),
      on_stuck_(std::move(on_stuck)) {
  if (world_ == 1) return;
  store_ = std::make_shared<StoreThread>();
  store_->store = pg.impl_->store->clone();
  store_->waits = pg.impl_->waits;
  std::thread(StoreThread::run, store_).detach();  // joined through `finished` (see the destructor)
  watcher_ = std::thread([this] { watch(); });
}

Heartbeat::~Heartbeat() {
  if (!store_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  watcher_.join();
  try {  // before the beats stop for good: the watcher of this rank does not report an ended rank
    const int rank = rank_;
    store_->ask<bool>([rank](c10d::Store& s) {
      s.set(activity_key(rank), std::vector<uint8_t>(kEnded, kEnded + std::char_traits<char>::length(kEnded)));
      return true;
    }, options_.interval);
  } catch (const std::exception&) {
    // rank 0's store is gone already: nobody is watching
  }
  {
    std::lock_guard<std::mutex> lock(store_->mutex);
    store_->stopping = true;
  }
  store_->wake.notify_one();
  // A store thread stuck in a call (rank 0 stopped) is left behind; it holds only the shared state.
  store_->finished.get_future().wait_for(options_.interval);
}

void Heartbeat::set_activity(const std::string& activity) {
  std::lock_guard<std::mutex> lock(mutex_);
  activity_ = activity;
  activity_changed_ = true;
}

void Heartbeat::watch() {
  const int rank = rank_, watched = (rank_ + 1) % world_;
  int64_t last_seen = -1;
  Clock::time_point last_change = Clock::now();
  for (bool first = true;; first = false) {
    std::optional<std::string> publish;
    std::string activity;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // The first beat at once: every rank makes its Heartbeat just after the rendezvous, so a rank whose counter
      // is still 0 after stale_after stopped before it could beat.
      if (!first && wake_.wait_for(lock, options_.interval, [this] { return stopping_; })) return;
      activity = activity_;
      if (activity_changed_) publish = activity_;
      activity_changed_ = false;
    }
    auto here = [&] {
      const std::string waiting = store_->waiting();
      return "rank " + std::to_string(rank) + " is at " + activity + (waiting.empty() ? "" : ", waiting in " + waiting);
    };
    try {
      const std::optional<int64_t> seen = store_->ask<int64_t>([=](c10d::Store& s) {
        if (publish) s.set(activity_key(rank), std::vector<uint8_t>(publish->begin(), publish->end()));
        s.add(beat_key(rank), 1);
        return s.add(beat_key(watched), 0);
      }, options_.stale_after);
      if (!seen) {
        on_stuck_(store_host_ + " is stuck: the job's store, which it serves, has not answered for " +
                  seconds_text(options_.stale_after) + "; " + here());
        return;
      }
      const Clock::time_point now = Clock::now();
      if (*seen != last_seen) {
        last_seen = *seen, last_change = now;
        continue;
      }
      if (now - last_change < options_.stale_after) continue;
      const std::string theirs =
          store_->ask<std::optional<std::string>>([=](c10d::Store& s) { return get_if_set(s, activity_key(watched)); },
                                                  options_.stale_after)
              .value_or(std::nullopt)
              .value_or("starting");
      if (theirs == kEnded) return;
      on_stuck_("rank " + std::to_string(watched) + " is stuck: no heartbeat for " + seconds_text(now - last_change) +
                " (it last said: " + theirs + "); " + here());
      return;
    } catch (const std::exception&) {
      return;  // the store closed: rank 0 has exited, the job is ending
    }
  }
}

std::string Heartbeat::describe_ranks() const {
  if (!store_) return "";
  const int world = world_;
  std::optional<std::map<std::string, std::vector<int>>> by_activity;
  try {
    by_activity = store_->ask<std::map<std::string, std::vector<int>>>([world](c10d::Store& s) {
      std::map<std::string, std::vector<int>> out;
      for (int r = 0; r < world; ++r) out[get_if_set(s, activity_key(r)).value_or("unknown")].push_back(r);
      return out;
    }, options_.stale_after);
  } catch (const std::exception& e) {
    return std::string("unknown: the store is closed (") + e.what() + ")";
  }
  if (!by_activity) return "unknown: the store does not answer (" + store_host_ + " is stuck)";
  std::string out;
  for (const auto& [activity, ranks] : *by_activity) {
    if (!out.empty()) out += "; ";
    out += (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks) + ": " + activity;
  }
  return out;
}

}  // namespace shardtrain::dist
