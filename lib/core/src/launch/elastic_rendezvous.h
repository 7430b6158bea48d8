// Elastic membership for `shardtrain launch --nnodes MIN:MAX` (private to the launch layer): torchrun's c10d
// rendezvous over the job's store. The launchers of a job meet in numbered rounds; a round closes with every node
// that joined it once MAX have, or once at least MIN have and no other has joined for the last-call time. Its
// nodes are numbered in the order they joined (node ranks come from the rendezvous, not from --node-rank), and
// the workers of round r run as attempt r (TORCHELASTIC_RESTART_COUNT). A round ends for every node when one of
// its nodes' workers failed, when a node stopped beating (a node lost: its launcher and workers gone, perhaps while
// the others' workers wait for it in a collective that only the timeout would end), or when a node has joined the
// next round (a node added, or one that arrived after the close): then each launcher stops its workers and joins
// the next round. The node serving the store must stay: its loss ends the job (as torchrun's).
//
// Keys, under "elastic/r<round>/": "joined" (a counter: join order), "node<i>" (the i-th node's name), "closed"
// (the round's size, written once by compare-and-set), "beat<i>" (node i's keep-alive counter), "failed" (why the
// round ended), "finished" (a counter: nodes whose workers all succeeded); and "elastic/ended" (why the job ended,
// for every node), "elastic/left" (a counter: nodes that heard it).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::launch {

struct ElasticOptions {
  int min_nodes = 1, max_nodes = 1;
  std::chrono::milliseconds last_call{30000};  // torchrun's last_call_timeout
  std::chrono::milliseconds join_timeout{600000};  // torchrun's join_timeout: a round that never fills
  // torchrun's keep_alive_interval and keep_alive_max_attempt: a node whose beat has not moved for interval x
  // attempts is lost.
  std::chrono::milliseconds keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  std::string node_name;  // this node, as the others' messages name it (host:pid)
};

// What join() throws once a node has ended the job (end_job): no round will run again.
class JobEnded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// This node's place in a closed round.
struct Membership {
  int round = 0;
  int node_rank = 0;  // 0 .. nnodes - 1, in join order
  int nnodes = 1;
};

class ElasticRendezvous {
 public:
  ElasticRendezvous(c10::intrusive_ptr<c10d::Store> store, ElasticOptions options);

  // Joins the first round not yet closed and waits for it to close with this node in it (a node that joined too
  // late goes on to the next). `waiting` is called now and then with what the round waits for. Throws
  // std::runtime_error when no round closes within join_timeout, saying how many of MIN nodes came, and JobEnded
  // (with its reason) when a node has ended the job.
  Membership join(const std::function<void(const std::string&)>& waiting = {});

  // Why this node's round is over: "" while it is not; else who failed and why, which node stopped beating, or that
  // a node waits to join. Beats for this node. Called often while the workers run; talks to the store once per
  // keep-alive interval.
  std::string ended(const Membership& m);
  // Ends round `round` for every node, saying why (this node's worker failed).
  void end(int round, const std::string& why);
  // Ends the job for every node (a failure no other round would change): their rounds end and join() throws.
  void end_job(const std::string& why);
  // After the job ended: says this node has heard; and the node serving the store waits (at most `limit`) until
  // `nodes` have, so that none finds the store gone before it reads why.
  void leave();
  void wait_for_leaving(int nodes, std::chrono::milliseconds limit);
  // torchrun's exit barrier: this node's workers finished; waits (at most `limit`) until every node of the round
  // has said the same, so that the store — which one of them serves — outlives every worker that may still use
  // it. Returns how many had not when it gave up (0: all).
  int finish(const Membership& m, std::chrono::milliseconds limit);

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  ElasticOptions options_;
  int next_round_ = 0;  // where the next join starts looking
  // The round being watched: each node's beat counter as last read, and when it last moved (this host's clock).
  int watched_round_ = -1;
  std::vector<int64_t> beats_;
  std::vector<std::chrono::steady_clock::time_point> moved_;
  std::chrono::steady_clock::time_point next_beat_{};
};

}  // namespace shardtrain::launch
