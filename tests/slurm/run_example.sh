#!/bin/bash
# examples/slurm/train.sbatch run as Slurm would run it on a 2-node allocation, on this one machine: srun and
# scontrol are stand-ins that set what the real ones set (tests/slurm/fake_*), the "nodes" are two launchers on
# loopback. The job must train on 4 ranks and leave a checkpoint that verifies, named after Slurm's job id.
#   run_example.sh SHARDTRAIN_BINARY SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d /tmp/shardtrain-slurm-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
cp "$src/tests/slurm/fake_srun" "$work/bin/srun"
cp "$src/tests/slurm/fake_scontrol" "$work/bin/scontrol"
chmod +x "$work/bin/srun" "$work/bin/scontrol"

"$bin" data synth --out "$work/data" --image-text 200 --text 80 --image 80 --eval 32 --image-size 32 \
  --shard-size 64 > /dev/null
cat > "$work/config.yaml" <<YAML
model: {flavor: flava-debug}
data:
  image_text: [$work/data/image_text]
  text: [$work/data/text]
  image: [$work/data/image]
  vocab: $work/data/vocab.txt
  mix: {image_text: 0.5, text: 0.25, image: 0.25}
  max_text_length: 16
optim: {lr: 2.0e-3, warmup_steps: 2}
train: {steps: 4, batch_size: 4}
log: {interval: 2, progress: lines, peak_tflops: 1}
parallel: {strategy: hybrid_shard}
YAML
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

status=0
env PATH="$work/bin:$PATH" SLURM_JOB_ID=4242 SLURM_NNODES=2 SLURM_JOB_NODELIST=127.0.0.1,127.0.0.1 \
  SHARDTRAIN="$bin" GPUS_PER_NODE=2 MASTER_PORT="$port" \
  bash "$src/examples/slurm/train.sbatch" "$work/config.yaml" --checkpoint.dir="$work/ckpt" > "$work/out.txt" 2>&1 ||
  status=$?
fail() { echo "FAIL: $1"; cat "$work/out.txt"; exit 1; }
[[ $status -eq 0 ]] || fail "the job exited with $status"
grep -q "shardtrain on 2 nodes x 2 workers, rendezvous at 127.0.0.1:$port, job 4242" "$work/out.txt" ||
  fail "the script's summary line"
grep -q "on 4 ranks, hybrid_shard" "$work/out.txt" || fail "not one job of 4 ranks"
"$bin" checkpoint verify "$work/ckpt" > "$work/verify.txt" || { cat "$work/verify.txt"; fail "checkpoint verify"; }
grep -q "ok  step 4, .* world 4, run 4242" "$work/verify.txt" || { cat "$work/verify.txt"; fail "the run id"; }
echo "ok: examples/slurm/train.sbatch trained 4 ranks on 2 nodes; $(cat "$work/verify.txt")"
