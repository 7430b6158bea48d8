#!/usr/bin/env bash
# The test command: brings the build up to date, then runs every test (unit, multi-process through the launcher at
# world sizes 1-4, launcher supervision, end to end), then every libFuzzer target for 30 s
# (SHARDTRAIN_FUZZ_SECONDS; 0 skips them). Extra arguments go to ctest alone, e.g. scripts/test.sh -R collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)" "$@"
if [ $# -eq 0 ] && [ "${SHARDTRAIN_FUZZ_SECONDS:-30}" != 0 ]; then
  bash scripts/fuzz.sh "${SHARDTRAIN_FUZZ_SECONDS:-30}"
fi
