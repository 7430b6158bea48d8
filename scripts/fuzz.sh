#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, ASan + UBSan) in build-fuzz/ and runs each for SECONDS (default 30) on a
# copy of its seed corpus (fuzz/corpus/NAME; what the run finds stays in build-fuzz/corpus/NAME). A crash stops
# the script with libFuzzer's report and the input that caused it (build-fuzz/crash-*).
#   scripts/fuzz.sh [SECONDS] [NAME...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(fuzz_safetensors fuzz_tar fuzz_image fuzz_config fuzz_vocab fuzz_tokenizer_json fuzz_checkpoint_meta)

if [ ! -f build-fuzz/CMakeCache.txt ]; then
  TORCH_PREFIX=$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DCMAKE_CXX_COMPILER="$(command -v clang++)" -DSHARDTRAIN_FUZZ=ON -DBUILD_TESTING=OFF \
    -DSHARDTRAIN_PRECOMPILED_HEADERS=OFF >build-fuzz-configure.log 2>&1 || { cat build-fuzz-configure.log; exit 1; }
fi
cmake --build build-fuzz --target fuzzers

# The sanitizers stop at the first error; LibTorch's own code is not instrumented, and its leak-free-at-exit is not
# ours to check.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for name in "${names[@]}"; do
  corpus=build-fuzz/corpus/$name
  mkdir -p "$corpus"
  echo "fuzz: $name for $seconds s (seeds: fuzz/corpus/$name)"
  (cd build-fuzz && ./fuzz/"$name" -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536 -timeout=10 \
    -print_final_stats=1 "corpus/$name" "../fuzz/corpus/$name" 2>"$name.log") ||
    { tail -60 "build-fuzz/$name.log"; echo "fuzz: $name FAILED (input: build-fuzz/crash-*)"; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/$name.log" | tr '\n' ' '; echo
done
echo "fuzz: every target ran $seconds s without a finding"
