"""How long a checkpoint stops training: checkpoint.async against synchronous saves, measured in one run each on
this machine (CPU, 2 ranks through `shardtrain launch`), on the README's main job (flava-debug, FULL_SHARD, its
synthetic data) and on FLAVA widened to tens of millions of parameters (model.overrides), each under FULL_SHARD and
DDP (under DDP rank 0 writes the whole model).

Each configuration trains STEPS steps saving every INTERVAL, once with synchronous saves and once with
checkpoint.async. The synchronous stall is what the trainer logs as "saved in X s" (planning, writing, hashing,
the manifest, fsync and rename); the asynchronous one is "staged in X s" (the finite check and the copy into the
staging buffer), the write's own time is "written (X s in the background". Prints the median of each over the saves
after the first, their ratio (goal, issue 65: the async stall <= 10% of the synchronous save) and each run's wall
time (the writes compete for the same two cores when asynchronous).

    .venv/bin/python bench/checkpoint_stall.py [--build build] [--steps 12] [--interval 2] [--sizes debug,wide]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {
    # The README's main job's model.
    "debug": "",
    # FLAVA 512 wide, 4 unimodal and 2 multimodal layers: tens of millions of parameters (said at start).
    "wide": "--model.overrides={dim: 512, mlp_dim: 2048, heads: 8, unimodal_layers: 4, multimodal_layers: 2}",
}


def run(cmd):
    start = time.monotonic()
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    wall = time.monotonic() - start
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {cmd}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out.stdout + out.stderr, wall


def seconds(pattern, text):
    return [float(x) for x in re.findall(pattern, text)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--interval", type=int, default=2)
    ap.add_argument("--sizes", default="debug,wide")
    ap.add_argument("--strategies", default="full_shard,ddp")
    args = ap.parse_args()
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    binary = os.path.join(root, args.build, "shardtrain")
    data = os.path.join(root, "data", "synth")
    if not os.path.exists(os.path.join(data, "vocab.txt")):
        run(f"{binary} data synth --out {data}")
    print(f"{'model':6} {'strategy':10} {'params':>11} {'sync save':>10} {'async stall':>12} {'ratio':>6} "
          f"{'staged':>9} {'bg write':>9} {'wall sync':>10} {'wall async':>11}")
    with tempfile.TemporaryDirectory(prefix="checkpoint-stall-") as tmp:
        for size in args.sizes.split(","):
            for strategy in args.strategies.split(","):
                base = (f"cd {root} && {binary} train configs/flava-debug.yaml --train.steps={args.steps} "
                        f"--train.eval_interval=0 --log.interval={args.steps} --log.dir= "
                        f"--checkpoint.interval={args.interval} --checkpoint.keep=2 "
                        f"--parallel.strategy={strategy} " + (f"'{SIZES[size]}' " if SIZES[size] else ""))
                sync_out, sync_wall = run(base + f"--checkpoint.dir={tmp}/{size}-{strategy}-sync")
                async_out, async_wall = run(base + f"--checkpoint.dir={tmp}/{size}-{strategy}-async "
                                            "--checkpoint.async=true")
                params = re.search(r"\(flava, ([\d,]+) parameters\)", sync_out).group(1)
                saved = seconds(r"\(saved in ([\d.e+-]+) s\)", sync_out)[1:]
                staged = seconds(r"staged in ([\d.e+-]+) s", async_out)[1:]
                written = seconds(r"written \(([\d.e+-]+) s in the background", async_out)[1:]
                mib = re.search(r": ([\d.]+ [MG]iB) staged in", async_out).group(1)
                if not saved or not staged:
                    sys.exit(f"no saves parsed for {size} {strategy}:\n{sync_out[-3000:]}\n{async_out[-3000:]}")
                s, a = statistics.median(saved), statistics.median(staged)
                w = statistics.median(written) if written else float("nan")
                print(f"{size:6} {strategy:10} {params:>11} {s:9.4f}s {a:11.4f}s {a / s:6.3f} {mib:>9} {w:8.4f}s "
                      f"{sync_wall:9.1f}s {async_wall:10.1f}s", flush=True)


if __name__ == "__main__":
    main()
