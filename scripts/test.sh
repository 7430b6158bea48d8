#!/usr/bin/env bash
# The test command: brings the build up to date, then runs every test (unit, multi-process through the launcher at
# world sizes 1-4, launcher supervision). Extra arguments go to ctest, e.g. scripts/test.sh -R collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build
ctest --test-dir build --output-on-failure --timeout 600 -j "$(nproc)" "$@"
