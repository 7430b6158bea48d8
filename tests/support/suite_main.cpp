// main() of a test binary whose ctest entries are whole suites (tests/cmake/suite_entries.cmake): an entry passes
// only if every test it selected ran and passed; one that passed but skipped a test exits 77, which ctest reports
// as Skipped, so a skip is never hidden inside a Passed entry.
#include <gtest/gtest.h>

#include "support/skip_code.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return shardtrain::testing::skipped_if_any(RUN_ALL_TESTS());
}
