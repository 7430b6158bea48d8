#!/usr/bin/env bash
# The test command: brings the build up to date, then runs the tests.
#   scripts/test.sh            everything, what CI runs: every tier (unit, multi-process through the launcher at world
#                              sizes 1-4, launcher supervision, end to end, the slow comparisons with Hugging Face),
#                              then every libFuzzer target on its seeds and FUZZ_RUNS (default 20000) inputs mutated
#                              from a fixed seed, the same on every run (scripts/fuzz.sh --check; FUZZ_RUNS=0 skips
#                              them; exploring runs with random seeds: scripts/fuzz.sh SECONDS)
#   scripts/test.sh --fast     the edit loop's tier: single-process units and parsers (ctest -L fast, under 2 minutes)
#   scripts/test.sh ARGS...    ctest with ARGS alone, no fuzzers: -L multiprocess|train|slow for a tier
#                              (tests/CMakeLists.txt says which is which), -R collectives for tests by name
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build
args=("$@")
[ "${1:-}" = --fast ] && args=(-L fast)
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)" "${args[@]}"
if [ $# -eq 0 ] && [ "${FUZZ_RUNS:-20000}" != 0 ]; then
  bash scripts/fuzz.sh --check
fi
