// The process group shared by the multi-process tests. Each test binary in tests/multiprocess runs as one rank under
// `shardtrain launch`; every rank runs the same tests in the same order, so their collectives line up. Checks use
// EXPECT (not ASSERT) around collectives so that a failing rank keeps its place in the sequence.
#pragma once

#include "shardtrain/distributed/process_group.h"

namespace shardtrain::testing {

dist::ProcessGroup& test_process_group();

}  // namespace shardtrain::testing
