// The shape of every error-message test: `fn` must throw an E whose message contains each of `needles`.
// Returns the message (empty when nothing or something else was thrown) for tests that show it.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

namespace shardtrain::testing {

template <class E, class F>
std::string expect_error(F&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(what.find(needle), std::string::npos) << "expected \"" << needle << "\" in: " << what;
    }
    return what;
  }
  ADD_FAILURE() << "no error (expected one containing \"" << *needles.begin() << "\")";
  return {};
}

}  // namespace shardtrain::testing
