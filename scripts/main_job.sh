#!/usr/bin/env bash
# The README's main job: writes the synthetic dataset once (data/synth), then trains flava-debug on it with 2
# processes (configs/flava-debug.yaml; launch.num_processes: 2 makes `shardtrain train` start its own workers).
# Extra arguments are config overrides, e.g. scripts/main_job.sh --train.steps=500.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f data/synth/vocab.txt ]; then
  build/shardtrain data synth --out data/synth
fi
exec build/shardtrain train configs/flava-debug.yaml "$@"
