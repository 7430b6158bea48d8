#!/usr/bin/env bash
# The test command: brings the build up to date, then runs the tests.
#   scripts/test.sh            everything, what CI runs: every tier (unit, multi-process through the launcher at world
#                              sizes 1-4, launcher supervision, end to end, the slow comparisons with Hugging Face),
#                              and beside them every libFuzzer target on its seeds and FUZZ_RUNS (default 20000)
#                              inputs mutated from a fixed seed, the same on every run (scripts/fuzz.sh --check;
#                              FUZZ_RUNS=0 skips them; exploring runs with random seeds: scripts/fuzz.sh SECONDS)
#   scripts/test.sh --fast     the edit loop's tier: single-process units and parsers (ctest -L fast, under 2 minutes)
#   scripts/test.sh ARGS...    ctest with ARGS alone, no fuzzers: -L multiprocess|train|slow for a tier
#                              (tests/CMakeLists.txt says which is which), -R collectives for tests by name
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build
args=("$@")
[ "${1:-}" = --fast ] && args=(-L fast)
# The fuzzers' check runs beside ctest at the lowest priority: the tests leave about a third of the cores idle (ranks
# waiting in collectives, processes loading LibTorch, Python), which the fuzzers take, while the tests keep theirs.
fuzz_pid=
if [ $# -eq 0 ] && [ "${FUZZ_RUNS:-20000}" != 0 ]; then
  fuzz_log=$(mktemp)
  nice -n 19 bash scripts/fuzz.sh --check >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
fi
status=0
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)" "${args[@]}" || status=$?
if [ -n "$fuzz_pid" ]; then
  fuzz_status=0
  wait "$fuzz_pid" || fuzz_status=$?
  cat "$fuzz_log"
  rm -f "$fuzz_log"
  [ $status -ne 0 ] || status=$fuzz_status
fi
exit $status
