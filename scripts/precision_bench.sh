#!/usr/bin/env bash
# What precision costs in accuracy and buys in memory and time, on one model and one data stream: flava-debug on
# the synthetic shards (configs/flava-debug.yaml, 2 ranks, FULL_SHARD) trained STEPS steps (default 300) six ways —
# float32; bf16 mixed precision (float32 weights); pure bf16 with AnyPrecision AdamW and Kahan summation; fp16
# mixed precision with loss scaling; bf16 mixed precision with the transformer layers' GEMMs in float8 (train.fp8:
# tensorwise, rowwise). Prints each run's items/s, peak memory per rank and final loss, and draws the runs' curves
# with `shardtrain report` into OUT (default runs/precision/report.png).
#
#   scripts/precision_bench.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/precision}
steps=${STEPS:-300}
[[ -d data/synth ]] || build/shardtrain data synth --out data/synth
declare -A ways=(
  [fp32]=""
  [bf16-mixed]="--parallel.mixed_precision=bf16"
  [bf16-pure-kahan]="--model.dtype=bf16 --optim.name=anyprecision_adamw --optim.use_kahan_summation=true"
  [fp16-scaled]="--parallel.mixed_precision=fp16"
  [fp8-tensorwise]="--parallel.mixed_precision=bf16 --train.fp8=tensorwise"
  [fp8-rowwise]="--parallel.mixed_precision=bf16 --train.fp8=rowwise"
)
order=(fp32 bf16-mixed bf16-pure-kahan fp16-scaled fp8-tensorwise fp8-rowwise)
for name in "${order[@]}"; do
  echo "precision_bench: $name (${ways[$name]:-defaults})" >&2
  # shellcheck disable=SC2086
  build/shardtrain train configs/flava-debug.yaml ${ways[$name]} --train.steps="$steps" --log.interval=25 \
    --train.eval_interval=0 --optim.warmup_steps=20 --log.progress=lines --log.dir="$out/$name" \
    --checkpoint.dir="$out/$name/checkpoints" --checkpoint.overwrite=true --checkpoint.interval=0 >"$out-$name.log" 2>&1
done
.venv/bin/python - "$out" "${order[@]}" <<'PY'
import csv, sys
out, names = sys.argv[1], sys.argv[2:]
print(f"{'run':<18} {'items/s':>8} {'peak MiB/rank':>14} {'loss first':>11} {'loss last':>10}")
for name in names:
    rows = list(csv.DictReader(open(f"{out}/{name}/metrics.csv")))
    speeds = [float(r["items_per_s"]) for r in rows if r["items_per_s"] not in ("", "nan")]
    peak = max(float(r["peak_memory_gib"]) for r in rows) * 1024
    print(f"{name:<18} {sum(speeds) / len(speeds):>8.1f} {peak:>14.1f} {float(rows[0]['loss']):>11.4f} "
          f"{float(rows[-1]['loss']):>10.4f}")
PY
build/shardtrain report "${order[@]/#/$out/}" --out "$out"
