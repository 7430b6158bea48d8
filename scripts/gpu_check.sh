#!/usr/bin/env bash
# The CUDA checks of a GPU session (docs/notes/gpu.md), after scripts/gpu_build.sh: each stage bounded in time, its
# log in $LOGS (default build-gpu/logs) and a one-line verdict on stdout.
#
#   scripts/gpu_check.sh STAGE...     stages: info, cuda_tests, synth, train_debug, train_ranks, sanitize
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
logs=${LOGS:-$build/logs}
mkdir -p "$logs"
# shellcheck disable=SC1091
source "$build/deps/env.sh"
cli=$build/shardtrain

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "[$name] exit $rc in $(( $(date +%s) - start )) s (log $logs/$name.log)"
  if [[ $rc -ne 0 ]]; then tail -n 25 "$logs/$name.log"; fi
  return 0
}

# A short flava-debug run on the synthetic shards; extra arguments override config keys.
train_debug=("$cli" train configs/flava-debug.yaml --train.device=cuda --train.steps=60 --log.interval=20
             --train.eval_interval=0 --checkpoint.interval=30 --checkpoint.overwrite=true --log.progress=lines)

for s in "$@"; do
  case $s in
    info) stage info 30 bash -c 'nvidia-smi; ldd --version | head -1; ${CXX:-c++} --version | head -1' ;;
    cuda_tests) stage cuda_tests 240 ctest --test-dir "$build" -R '^cuda\.' --output-on-failure ;;
    synth) stage synth 240 "$cli" data synth --out data/synth --image-text 4000 --text 1000 --image 1000 --eval 512 ;;
    train_debug) stage train_debug 150 "${train_debug[@]}" --launch.num_processes=1 --checkpoint.dir=runs/gpu-debug1/ck \
                   --log.dir=runs/gpu-debug1 ;;
    train_ranks) stage train_ranks 200 "${train_debug[@]}" --launch.num_processes=2 --checkpoint.dir=runs/gpu-debug2/ck \
                   --log.dir=runs/gpu-debug2 ;;
    sanitize) stage sanitize 400 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 9 \
                "$cli" launch --nproc-per-node 1 -- "$build/tests/cuda_tests" ;;
    *) echo "gpu_check.sh: unknown stage '$s' (info, cuda_tests, synth, train_debug, train_ranks, sanitize)" >&2
       exit 2 ;;
  esac
done
