#!/usr/bin/env bash
# One row of docs/notes/gpu.md: shardtrain's trainer (configs/flava-gpu.yaml) and transformers' FlavaForPreTraining
# (bench/flava_gpu.py) on the same flavor, batch and checkpointing, one after the other on the one GPU.
#
#   scripts/gpu_bench.sh FLAVOR BATCH [ac] [-- TRAINER_OVERRIDE...]
#
# Needs scripts/gpu_build.sh's build (BUILD, default build-gpu) and `shardtrain data synth --out data/synth`.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
logs=${LOGS:-$build/logs}
mkdir -p "$logs"
# shellcheck disable=SC1091
source "$build/deps/env.sh"
flavor=$1 batch=$2
shift 2
ac=false
if [[ "${1:-}" == ac ]]; then ac=true; shift; fi
[[ "${1:-}" == -- ]] && shift
tag="$flavor-b$batch$([[ $ac == true ]] && echo -ac)"

# train.force: a benchmark probes batches near the device's limit; the memory model's refusal would end the probe.
timeout 400 "$build/shardtrain" train configs/flava-gpu.yaml --model.flavor="$flavor" --train.batch_size="$batch" \
  --parallel.activation_checkpointing=$ac --train.force=true --log.dir="runs/gpu-$tag" "$@" >"$logs/ours-$tag.log" 2>&1
echo "ours $tag: exit $? | $(grep -E 'step [0-9]+/[0-9]+' "$logs/ours-$tag.log" | tail -1 | sed 's/.*items/items/')" \
     "| $(grep -o 'predicted peak [0-9.]* GiB' "$logs/ours-$tag.log" | head -1)"
grep -E 'error|Error' "$logs/ours-$tag.log" | head -5

hf_args=(--flavor "$flavor" --batch "$batch")
[[ $ac == true ]] && hf_args+=(--checkpoint)
timeout 300 python3 bench/flava_gpu.py "${hf_args[@]}" >"$logs/hf-$tag.log" 2>&1
echo "hf   $tag: exit $? | $(tail -1 "$logs/hf-$tag.log")"
