#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, ASan + UBSan) in build-fuzz/ and runs each on its seed corpus
# (fuzz/corpus/NAME). A crash stops the script with libFuzzer's report and the input that caused it
# (build-fuzz/crash-*). Two ways to run:
#   scripts/fuzz.sh [SECONDS] [NAME...]      explore: random seeds, SECONDS (default 30) each, what the run finds
#                                            kept in build-fuzz/corpus/NAME for the next run
#   scripts/fuzz.sh --check [NAME...]        reproduce: every seed input, then FUZZ_RUNS (default 20000) inputs
#                                            mutated from fixed seed 1 on a fresh corpus — the same inputs on every
#                                            run of the same code, so a failure is the code's, found again by
#                                            running it again (what scripts/test.sh and CI run)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
  # A bound in time only, far above what FUZZ_RUNS takes here (the slowest target: about 75 s); a target stopped by
  # it before its FUZZ_RUNS inputs (a loaded machine) fails below rather than checking fewer.
  seconds=120
else
  seconds=${1:-30}
  shift || true
fi
runs=${FUZZ_RUNS:-20000}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(fuzz_safetensors fuzz_tar fuzz_image fuzz_config fuzz_vocab fuzz_tokenizer_json fuzz_checkpoint_meta
                                 fuzz_state_dict_program fuzz_dcp_metadata fuzz_arrow
                                 fuzz_parquet)

if [ ! -f build-fuzz/CMakeCache.txt ]; then
  TORCH_PREFIX=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DCMAKE_CXX_COMPILER="$(command -v clang++)" -DSHARDTRAIN_FUZZ=ON -DBUILD_TESTING=OFF \
    -DSHARDTRAIN_PRECOMPILED_HEADERS=OFF -DPython3_EXECUTABLE="$PWD/.venv/bin/python" >build-fuzz-configure.log 2>&1 || { cat build-fuzz-configure.log; exit 1; }
fi
cmake --build build-fuzz --target fuzzers

# The sanitizers stop at the first error; LibTorch's own code is not instrumented, and its leak-free-at-exit is not
# ours to check.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target: its output in build-fuzz/NAME.log, its exit status in build-fuzz/NAME.status.
run_target() {
  local name=$1 corpus mode
  if [ $check = 1 ]; then
    corpus=build-fuzz/check-corpus/$name
    rm -rf "$corpus"
    mode=(-seed=1 -runs="$runs")
  else
    corpus=build-fuzz/corpus/$name
    mode=()
  fi
  mkdir -p "$corpus"
  local status=0
  (cd build-fuzz && ./fuzz/"$name" "${mode[@]}" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 \
    -timeout=10 -print_final_stats=1 "${corpus#build-fuzz/}" "../fuzz/corpus/$name" 2>"$name.log") || status=$?
  echo $status >"build-fuzz/$name.status"
}

# The targets run side by side, one per core (each is one process on one core; their inputs do not depend on
# one another), and are reported in order once all have ended.
for name in "${names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  rm -f "build-fuzz/$name.status"
  run_target "$name" &
done
wait
failed=0
for name in "${names[@]}"; do
  if [ $check = 1 ]; then
    echo "fuzz: $name, $runs inputs from seed 1 (seeds: fuzz/corpus/$name)"
  else
    echo "fuzz: $name for $seconds s (seeds: fuzz/corpus/$name)"
  fi
  if [ "$(cat "build-fuzz/$name.status" 2>/dev/null)" != 0 ]; then
    tail -60 "build-fuzz/$name.log"
    echo "fuzz: $name FAILED (input: build-fuzz/crash-*)"
    failed=1
    continue
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/$name.log" | tr '\n' ' '; echo
  executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "build-fuzz/$name.log")
  if [ $check = 1 ] && [ "${executed:-0}" -lt "$runs" ]; then
    echo "fuzz: $name ran ${executed:-0} of its $runs inputs within $seconds s"
    failed=1
  fi
done
[ $failed = 0 ] || exit 1
if [ $check = 1 ]; then
  echo "fuzz: every target ran its seeds and $runs inputs from seed 1 without a finding"
else
  echo "fuzz: every target ran $seconds s without a finding"
fi
