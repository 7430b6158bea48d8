#include "distributed/connect_agreed.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdio>
#include <stdexcept>
#include <vector>

#include "distributed/error_text.h"

namespace shardtrain::dist {
namespace {

const std::string kConnected = "connected";

std::string outcome_key(int rank) { return "outcome" + std::to_string(rank); }

std::string as_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

c10::intrusive_ptr<c10d::Backend> connect_agreed(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 int attempts, std::chrono::milliseconds timeout,
                                                 const std::string& name, const ConnectFn& connect) {
  if (attempts < 1) throw std::invalid_argument("connect_agreed: attempts " + std::to_string(attempts) + " < 1");
  std::string failures;  // each failed rank's reason, of the last attempt
  for (int attempt = 0; attempt < attempts; ++attempt) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("attempt" + std::to_string(attempt), store);
    c10::intrusive_ptr<c10d::Backend> backend;
    std::string outcome = kConnected;
    try {
      backend = connect(prefixed);
    } catch (const std::exception& e) {
      outcome = "failed: " + error_text(e);
    }
    prefixed->set(outcome_key(rank), std::vector<uint8_t>(outcome.begin(), outcome.end()));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(outcome_key(r));
    try {
      prefixed->wait(keys, 2 * timeout);
    } catch (const std::exception& e) {
      std::string missing;
      for (int r = 0; r < size; ++r) {
        if (!prefixed->check({outcome_key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw std::runtime_error("group '" + name + "': rank(s) " + missing + " said nothing about connecting within " +
                               std::to_string(2 * timeout.count()) + " ms (died or hang; attempt " +
                               std::to_string(attempt + 1) + " of " + std::to_string(attempts) +
                               "): " + error_text(e));
    }
    failures.clear();
    for (int r = 0; r < size; ++r) {
      const std::string theirs = as_text(prefixed->get(outcome_key(r)));
      if (theirs != kConnected) failures += "\n  rank " + std::to_string(r) + ": " + theirs;
    }
    if (failures.empty()) return backend;
    if (attempt + 1 < attempts) {
      std::fprintf(stderr, "shardtrain: rank %d: group '%s' did not connect on every rank (attempt %d of %d), all "
                           "try again:%s\n", rank, name.c_str(), attempt + 1, attempts, failures.c_str());
    }
  }
  throw std::runtime_error("group '" + name + "' did not connect on every rank in " + std::to_string(attempts) +
                           " attempts; the last:" + failures);
}

}  // namespace shardtrain::dist
