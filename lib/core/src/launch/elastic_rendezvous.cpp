#include "launch/elastic_rendezvous.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "shardtrain/util/seconds_text.h"

namespace shardtrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string key(int round, const std::string& name) {
  return "elastic/r" + std::to_string(round) + "/" + name;
}

using util::seconds_text;

}  // namespace

ElasticRendezvous::ElasticRendezvous(c10::intrusive_ptr<c10d::Store> store, ElasticOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (options_.min_nodes < 1 || options_.min_nodes > options_.max_nodes) {
    throw std::invalid_argument("elastic rendezvous: MIN " + std::to_string(options_.min_nodes) + " and MAX " +
                                std::to_string(options_.max_nodes) + " nodes: expected 1 <= MIN <= MAX");
  }
}

Membership ElasticRendezvous::join(const std::function<void(const std::string&)>& waiting) {
  const auto start = Clock::now();
  auto next_note = start + std::chrono::seconds(5);
  const auto closed_size = [&](int round) -> std::optional<int> {
    if (!store_->check({key(round, "closed")})) return std::nullopt;
    return std::stoi(text_of(store_->get(key(round, "closed"))));
  };
  for (int round = next_round_;; ++round) {
    if (store_->check({"elastic/ended"})) throw JobEnded(text_of(store_->get("elastic/ended")));
    if (closed_size(round)) continue;  // under way, or over: its nodes will come to a later one
    const int index = static_cast<int>(store_->add(key(round, "joined"), 1)) - 1;
    store_->set(key(round, "node" + std::to_string(index)), bytes_of(options_.node_name));
    int seen = -1;
    auto seen_since = Clock::now();
    while (true) {
      if (store_->check({"elastic/ended"})) throw JobEnded(text_of(store_->get("elastic/ended")));
      if (const std::optional<int> size = closed_size(round)) {
        if (index < *size) {
          next_round_ = round + 1;
          return {round, index, *size};
        }
        break;  // it closed without this node: the next round
      }
      const int joined = static_cast<int>(store_->add(key(round, "joined"), 0));
      const auto now = Clock::now();
      if (joined != seen) seen = joined, seen_since = now;
      // Full, or enough and no one else for the last call: the first node to see it closes the round for all.
      if (joined >= options_.max_nodes || (joined >= options_.min_nodes && now - seen_since >= options_.last_call)) {
        store_->compareSet(key(round, "closed"), {}, bytes_of(std::to_string(std::min(joined, options_.max_nodes))));
        continue;
      }
      if (now - start >= options_.join_timeout) {
        throw std::runtime_error("the rendezvous of round " + std::to_string(round) + " has " +
                                 std::to_string(joined) + " of the " + std::to_string(options_.min_nodes) +
                                 " nodes it needs at least (--nnodes " + std::to_string(options_.min_nodes) + ":" +
                                 std::to_string(options_.max_nodes) + ") after " + seconds_text(now - start) +
                                 " (join_timeout)");
      }
      if (waiting && now >= next_note) {
        waiting("rendezvous round " + std::to_string(round) + ": " + std::to_string(joined) + " node(s) joined, " +
                (joined < options_.min_nodes ? "waiting for at least " + std::to_string(options_.min_nodes)
                                             : "waiting up to " + seconds_text(options_.last_call) + " for more (" +
                                                   std::to_string(options_.max_nodes) + " at most)") +
                " (" + seconds_text(now - start) + " of " + seconds_text(options_.join_timeout) + ")");
        next_note = now + std::chrono::seconds(5);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

std::string ElasticRendezvous::ended(const Membership& m) {
  const auto now = Clock::now();
  if (m.round != watched_round_) {
    watched_round_ = m.round;
    beats_.assign(static_cast<size_t>(m.nnodes), -1);
    moved_.assign(static_cast<size_t>(m.nnodes), now);
    next_beat_ = now;
  }
  if (now < next_beat_) return "";
  next_beat_ = now + options_.keep_alive_interval;
  store_->add(key(m.round, "beat" + std::to_string(m.node_rank)), 1);
  if (store_->check({"elastic/ended"})) return text_of(store_->get("elastic/ended"));
  if (store_->check({key(m.round, "failed")})) return text_of(store_->get(key(m.round, "failed")));
  if (store_->check({key(m.round + 1, "joined")})) {
    return "a node joined rendezvous round " + std::to_string(m.round + 1);
  }
  const auto lost_after = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  for (int i = 0; i < m.nnodes; ++i) {
    const int64_t beat = store_->add(key(m.round, "beat" + std::to_string(i)), 0);
    const size_t at = static_cast<size_t>(i);
    if (beat != beats_[at]) beats_[at] = beat, moved_[at] = now;
    if (i != m.node_rank && now - moved_[at] >= lost_after) {
      const std::string name = store_->check({key(m.round, "node" + std::to_string(i))})
                                   ? text_of(store_->get(key(m.round, "node" + std::to_string(i))))
                                   : "?";
      const std::string why = "node " + std::to_string(i) + " (" + name + ") lost: no keep-alive for " +
                              seconds_text(now - moved_[at]);
      end(m.round, why);
      return why;
    }
  }
  return "";
}

int ElasticRendezvous::finish(const Membership& m, std::chrono::milliseconds limit) {
  store_->add(key(m.round, "finished"), 1);
  const auto deadline = Clock::now() + limit;
  while (true) {
    const int finished = static_cast<int>(store_->add(key(m.round, "finished"), 0));
    if (finished >= m.nnodes || Clock::now() >= deadline) return std::max(0, m.nnodes - finished);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ElasticRendezvous::end_job(const std::string& why) {
  store_->compareSet("elastic/ended", {}, bytes_of(why));
}

void ElasticRendezvous::leave() { store_->add("elastic/left", 1); }

void ElasticRendezvous::wait_for_leaving(int nodes, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (store_->add("elastic/left", 0) < nodes && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ElasticRendezvous::end(int round, const std::string& why) {
  store_->compareSet(key(round, "failed"), {}, bytes_of(why));  // the first reason stays
}

}  // namespace shardtrain::launch
