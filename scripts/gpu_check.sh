#!/usr/bin/env bash
# The CUDA checks of a GPU session (docs/notes/gpu.md), after scripts/gpu_build.sh: each stage bounded in time, its
# log in $LOGS (default build-gpu/logs) and a one-line verdict on stdout.
#
#   scripts/gpu_check.sh STAGE...     checks: info, cuda_tests, synth, train_debug, train_ranks, train_tp, sanitize
#                                     measurements (after synth): optimizer, tf32, memory, disk, act_offload, auto,
#                                     oom, compare, float8
#
# cuda_tests: tests/cuda at one rank, verbose (what the tests print: the host's peak of a checkpoint, what releasing
# cuBLAS's workspaces freed).
# train_tp: tensor parallelism on the device (after synth): gpt2-debug without dropout at one rank, then over 2
# ranks sharing the GPU (tp 2, sequence parallel, checkpointed; collectives over Gloo), the loss lines compared; and
# with dropout at tp 2 (the split regions' own random streams on the CUDA generator), which must train.
# optimizer: build-gpu/optimizer_bench --device cuda, with a FLAVA layer's tensor size and with 1000 small tensors.
# tf32: a float32 flava-350m step (batch 32) with train.tf32 on and off, items/s of the last interval of each.
# memory: the memory model's predicted peak against the caching allocator's, flava-350m (with and without
# checkpointing) and flava-900m at batch 32, one rank, bf16.
# disk: the disk tier's AdamW step (build-gpu/disk_bench, 200M parameters' moments in a scratch file under
# ${DISK_DIR:-/tmp}) against the machine's disk measured in the same run, and CPU offload's step.
# act_offload: activation offloading's cost (parallel.activation_offload): flava-350m bf16 with checkpointing at
# batch 32, without and with offloading the checkpoints' inputs, then at batch 64 offloaded; items/s and peaks.
# compare: scripts/gpu_bench.sh flava-350m 32, ours beside transformers' FlavaForPreTraining on the same device.
# auto: train.batch_size auto on the whole device (flava-350m, bf16): the largest batch the model fits, its
# measured peak beside the prediction.
# oom: train.batch_size auto planned for 16 GiB on a device capped at 8 GiB (train.memory_limit): the first or
# second step runs out of memory, the run halves the batch until it trains (flava-350m, bf16).
# float8: llama-3.2-1b at 2048 packed tokens, batch 4, bf16 mixed precision, one rank (FSDP still gathers: bf16
# from float32 shards): without float8, with train.fp8 tensorwise, tensorwise with the float8 all-gather, and
# rowwise; each run's items/s over bf16's (the issue's goal: 1.25x) and the loss lines side by side.
#
# DEADLINE (seconds since the epoch) bounds the whole: a stage gets at most what is left before it, and one with
# under 20 s left is skipped, so one device command can run the stages in order of importance. COPY_TO (a folder,
# e.g. the device tool's $OUT) gets every stage's log appended to COPY_TO/logs.txt as the stage ends.
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
  if [[ -n "${DEADLINE:-}" ]]; then
    local left=$(( DEADLINE - start - 10 ))
    if (( left < 20 )); then echo "[$name] skipped: $left s left before DEADLINE"; return 0; fi
    (( limit > left )) && limit=$left
  fi
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "[$name] exit $rc in $(( $(date +%s) - start )) s (log $logs/$name.log)"
  if [[ $rc -ne 0 ]]; then tail -n 25 "$logs/$name.log"; fi
  if [[ -n "${COPY_TO:-}" ]]; then
    { echo "=== $name: exit $rc"; tail -n 400 "$logs/$name.log"; } >>"$COPY_TO/logs.txt"
  fi
  return 0
}

# A short flava-debug run on the synthetic shards; extra arguments override config keys.
train_debug=("$cli" train configs/flava-debug.yaml --train.device=cuda --train.steps=60 --log.interval=20
             --train.eval_interval=0 --checkpoint.interval=30 --checkpoint.overwrite=true --log.progress=lines)

# The last interval line's throughput and peak of a trainer log, and the memory model's prediction.
summary() {  # summary LOG
  local last
  last=$(grep -E 'step [0-9]+/[0-9]+' "$1" | tail -1)
  echo "  $(grep -oE 'items/s [0-9.]+|peak mem [0-9.]+ GiB' <<<"$last" | tr '\n' ' ')" \
       "| $(grep -oE 'predicted peak [0-9.]+ GiB' "$1" | head -1)"
}

# gpt2-debug on the synthetic texts, 20 steps on the device; extra arguments override config keys.
train_gpt2=("$cli" train configs/flava-debug.yaml --model.flavor=gpt2-debug --train.device=cuda --train.steps=20
            --log.interval=5 --train.eval_interval=0 --log.progress=lines --checkpoint.overwrite=true)

# One flava-gpu.yaml run (configs/flava-gpu.yaml: flava-350m, batch 32, bf16) with overrides, and its summary.
flava_gpu() {  # flava_gpu TAG OVERRIDE...
  local tag=$1
  shift
  stage "$tag" 300 "$cli" train configs/flava-gpu.yaml --train.steps=20 --log.interval=5 --log.dir="runs/gpu-$tag" "$@"
  summary "$logs/$tag.log"
}

for s in "$@"; do
  case $s in
    info) stage info 30 bash -c "nvidia-smi; ldd --version | head -1; \${CXX:-c++} --version | head -1; $cli env" ;;
    cuda_tests) stage cuda_tests 240 ctest --test-dir "$build" -R '^cuda\.' --output-on-failure -V ;;
    synth) stage synth 240 "$cli" data synth --out data/synth --image-text 4000 --text 1000 --image 1000 --eval 512 ;;
    train_debug) stage train_debug 150 "${train_debug[@]}" --launch.num_processes=1 --checkpoint.dir=runs/gpu-debug1/ck \
                   --log.dir=runs/gpu-debug1 ;;
    train_ranks) stage train_ranks 200 "${train_debug[@]}" --launch.num_processes=2 --checkpoint.dir=runs/gpu-debug2/ck \
                   --log.dir=runs/gpu-debug2 ;;
    train_tp) stage tp_one 150 "${train_gpt2[@]}" '--model.overrides={dropout: 0}' --launch.num_processes=1 \
                --checkpoint.dir=runs/gpu-tp1/ck --log.dir=runs/gpu-tp1
              stage tp_two 200 "${train_gpt2[@]}" '--model.overrides={dropout: 0}' --launch.num_processes=2 \
                --checkpoint.dir=runs/gpu-tp2/ck --log.dir=runs/gpu-tp2 \
                --parallel.tp_size=2 --parallel.sequence_parallel=true --parallel.activation_checkpointing=true
              one=$(grep -oE '^step [0-9]+/[0-9]+ +loss [0-9.]+' "$logs/tp_one.log")
              two=$(grep -oE '\[rank0\]: step [0-9]+/[0-9]+ +loss [0-9.]+' "$logs/tp_two.log" | sed 's/^\[rank0\]: //')
              if [[ -n "$one" && "$one" == "$two" ]]; then
                echo "  tp 2 losses equal one rank's: $(wc -l <<<"$one") lines"
              else
                echo "  tp 2 losses differ from one rank's (or a run logged none):"; diff <(echo "$one") <(echo "$two")
              fi
              stage tp_dropout 200 "${train_gpt2[@]}" --launch.num_processes=2 --parallel.tp_size=2 \
                --checkpoint.dir=runs/gpu-tp-dropout/ck --log.dir=runs/gpu-tp-dropout \
                --parallel.sequence_parallel=true --parallel.activation_checkpointing=true ;;
    sanitize) stage sanitize 400 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 9 \
                "$cli" launch --nproc-per-node 1 -- "$build/tests/cuda_tests" ;;
    optimizer) stage optimizer 300 "$build/optimizer_bench" --device cuda
               grep -E 'faster|memory bandwidth' "$logs/optimizer.log"
               stage optimizer_small 300 "$build/optimizer_bench" --device cuda --tensor-size 100000
               grep -E 'faster' "$logs/optimizer_small.log" ;;
    tf32) for on in true false; do flava_gpu "tf32-$on" --parallel.mixed_precision=no --train.tf32=$on; done ;;
    memory) flava_gpu memory-350m
            flava_gpu memory-350m-ac --parallel.activation_checkpointing=true
            flava_gpu memory-900m --model.flavor=flava-900m ;;
    disk) mkdir -p "${DISK_DIR:-/tmp}/shardtrain-disk"
          stage disk 120 "$build/disk_bench" --dir "${DISK_DIR:-/tmp}/shardtrain-disk" --params 200000000 --steps 2
          cat "$logs/disk.log" ;;
    act_offload) flava_gpu act-ac --parallel.activation_checkpointing=true
                 flava_gpu act-ac-offload --parallel.activation_checkpointing=true --parallel.activation_offload=true
                 flava_gpu act-ac-offload-64 --parallel.activation_checkpointing=true \
                   --parallel.activation_offload=true --train.batch_size=64 ;;
    auto) flava_gpu auto --train.batch_size=auto --train.steps=10
          grep -E 'train.batch_size: auto ->' "$logs/auto.log" ;;
    oom) flava_gpu oom --train.batch_size=auto --train.memory_budget=16GiB --train.memory_limit=8GiB
         grep -E 'out of memory in the first two steps|train.batch_size: auto ->' "$logs/oom.log" ;;
    async_save) flava_gpu save-sync --checkpoint.dir=runs/gpu-save-sync/ck --checkpoint.interval=5
                flava_gpu save-async --checkpoint.dir=runs/gpu-save-async/ck --checkpoint.interval=5 \
                  --checkpoint.async=true
                grep -hE 'saved in|staged in|written \(' "$logs/save-sync.log" "$logs/save-async.log" ;;
    compare) stage compare 400 scripts/gpu_bench.sh flava-350m 32
             cat "$logs/compare.log" ;;
    float8) for f in bf16 tensorwise gathered rowwise; do
              case $f in
                bf16) extra=() ;;
                gathered) extra=(--train.fp8=tensorwise --train.fp8_all_gather=true) ;;
                *) extra=(--train.fp8="$f") ;;
              esac
              stage "float8-$f" 240 "$cli" train configs/flava-debug.yaml --model.flavor=llama-3.2-1b \
                --train.device=cuda --train.steps=40 --log.interval=10 --train.eval_interval=0 --log.progress=lines \
                --data.max_text_length=2048 --data.packing=true --train.batch_size=4 --train.grad_accum=1 \
                --parallel.mixed_precision=bf16 --checkpoint.interval=0 --log.dir="runs/gpu-float8-$f" "${extra[@]}"
              summary "$logs/float8-$f.log"
              grep -E 'float8 ' "$logs/float8-$f.log" | head -2
            done
            base=$(grep -E 'step 40/40' "$logs/float8-bf16.log" | grep -oE 'items/s [0-9.]+' | awk '{print $2}')
            for f in tensorwise gathered rowwise; do
              ours=$(grep -E 'step 40/40' "$logs/float8-$f.log" | grep -oE 'items/s [0-9.]+' | awk '{print $2}')
              [[ -n "$base" && -n "$ours" ]] && awk -v a="$ours" -v b="$base" -v f="$f" \
                'BEGIN { printf "  %s over bf16: %.3fx items/s\n", f, a / b }'
            done
            paste <(grep -oE 'step [0-9]+/40 +loss [0-9.]+' "$logs/float8-bf16.log") \
                  <(grep -oE 'step [0-9]+/40 +loss [0-9.]+' "$logs/float8-tensorwise.log") ;;
    *) echo "gpu_check.sh: unknown stage '$s' (info, cuda_tests, synth, train_debug, train_ranks, train_tp, sanitize," \
            "optimizer, tf32, memory, disk, act_offload, auto, oom, compare, float8, async_save)" >&2
       exit 2 ;;
  esac
done
