#!/usr/bin/env bash
# The test command: brings the build up to date, then runs every test (unit, multi-process through the launcher at
# world sizes 1-4, launcher supervision, end to end), then every libFuzzer target on its seeds and FUZZ_RUNS
# (default 20000) inputs mutated from a fixed seed, the same on every run (scripts/fuzz.sh --check; FUZZ_RUNS=0
# skips them; exploring runs with random seeds: scripts/fuzz.sh SECONDS). Extra arguments go to ctest alone, e.g.
# scripts/test.sh -R collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)" "$@"
if [ $# -eq 0 ] && [ "${FUZZ_RUNS:-20000}" != 0 ]; then
  bash scripts/fuzz.sh --check
fi
