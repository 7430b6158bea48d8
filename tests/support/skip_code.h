// A test binary that ran nothing — every test skipped (no GPU) or none selected — exits with kSkipped, which ctest
// reports as Skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt) instead of Passed; one whose entry is a whole suite
// does so when it skipped any test.
#pragma once

#include <gtest/gtest.h>

namespace shardtrain::testing {

constexpr int kSkipped = 77;  // automake's and ctest's convention

// RUN_ALL_TESTS()'s `result`, or kSkipped when it passed without running a single test.
inline int skipped_or(int result) {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && unit.successful_test_count() == 0 && unit.failed_test_count() == 0) return kSkipped;
  return result;
}

// RUN_ALL_TESTS()'s `result`, or kSkipped when it passed but skipped a test (or ran none): a suite's entry is
// Passed only if every test it selected ran.
inline int skipped_if_any(int result) {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (result == 0 && (unit.skipped_test_count() > 0 || unit.successful_test_count() == 0)) return kSkipped;
  return result;
}

}  // namespace shardtrain::testing
