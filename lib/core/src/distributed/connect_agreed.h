// Connecting a group's backend, agreed over the store (private to the dist layer).
//
// A backend's connect can fail on some ranks only: Gloo's full mesh under load has failed with "Connection closed
// by peer" on one rank while the others went on, so the ranks disagreed about which groups exist and every later
// collective was mismatched (a hang until the timeout). Here each attempt runs under its own store prefix, then
// every member posts its outcome and reads everyone's: when all connected, done; otherwise every member drops what
// it made and all try again under a fresh prefix, at most `attempts` times, then throw naming each rank's reason.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace shardtrain::dist {

// Makes this rank's backend over the store it is given (the attempt's prefix); throws when it cannot.
using ConnectFn = std::function<c10::intrusive_ptr<c10d::Backend>(const c10::intrusive_ptr<c10d::Store>&)>;

// rank in [0, size) of the group `name`. `timeout` bounds the wait for the others' outcomes, twice over: a member
// whose connect waits out its own timeout before failing still posts in time. Throws std::runtime_error naming the
// group, the attempts and each failed rank's reason, or the ranks that posted nothing (died or hang).
c10::intrusive_ptr<c10d::Backend> connect_agreed(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 int attempts, std::chrono::milliseconds timeout,
                                                 const std::string& name, const ConnectFn& connect);

}  // namespace shardtrain::dist
