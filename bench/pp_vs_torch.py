"""Our pipeline parallelism against PyTorch's (torch.distributed.pipelining on transformers' LlamaForCausalLM) on
the same Llama, weights and batches, in one run: step time and peak CPU memory per rank (shardtrain's counting
allocator on both sides), their ratios, the losses side by side, and our measured bubble (the busiest rank's share
of the step spent waiting: the bottleneck's) beside the schedule's own figure. Shapes are swept (each a llama-debug with
model.overrides); every schedule — GPipe, 1F1B, interleaved 1F1B (2 stages a rank), zero bubble (ours ZB-H1,
PyTorch's ScheduleInterleavedZeroBubble at one stage a rank) — on 2 pipeline ranks. --plot FILE draws the ratios
(docs/notes/figures/pp-vs-torch.png).

    .venv/bin/python bench/pp_vs_torch.py [--build build] [--steps 6] [--microbatches 4] [--shapes small,wide,long]

Both sides cut the layers as evenly as they divide (torchtitan's default), the head's work on the last stage. On
CPU the ranks of one machine share its cores: the ratios compare the two implementations, and the measured bubble
includes the transfers and the cores the ranks share (docs/notes/benchmarks.md).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import bench_common

# name -> (model.overrides of llama-debug, batch rows, tokens per row)
SHAPES = {
    "small": ("dim=256,layers=4,heads=8,kv_heads=4,mlp_dim=688,vocab_size=8000,max_positions=1024", 8, 256),
    "wide": ("dim=512,layers=4,heads=8,kv_heads=8,mlp_dim=1376,vocab_size=32000,max_positions=1024", 4, 256),
    "deep": ("dim=256,layers=8,heads=8,kv_heads=4,mlp_dim=688,vocab_size=8000,max_positions=1024", 8, 128),
}
# name -> stages per rank
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zero_bubble": 1}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--shapes", default="small,wide,deep")
    p.add_argument("--schedules", default=",".join(SCHEDULES))
    p.add_argument("--plot", default=None)
    a = p.parse_args()
    launcher = os.path.join(a.build, "shardtrain")
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    world = 2
    rows = []
    for shape in a.shapes.split(","):
        overrides, batch, seq = SHAPES[shape]
        with tempfile.TemporaryDirectory(prefix="shardtrain-pp-bench-") as inputs:
            subprocess.run([os.path.join(a.build, "tp_bench"), "--write-inputs", inputs, "--flavor", "llama-debug",
                            "--overrides", overrides, "--batch", str(batch), "--seq", str(seq), "--steps",
                            str(a.steps)], check=True)
            for schedule in a.schedules.split(","):
                per_rank = SCHEDULES[schedule]
                common = ["--inputs", inputs, "--schedule", schedule, "--microbatches", str(a.microbatches),
                          "--stages-per-rank", str(per_rank), "--steps", str(a.steps)]
                launch = [launcher, "launch", "--nproc-per-node", str(world), "--"]
                print(f"  {shape}: {schedule}", file=sys.stderr, flush=True)
                torch_r = bench_common.run_result(launch + [sys.executable, os.path.join(here, "pp_reference.py"),
                                                            "--memhook", memhook] + common)
                ours_r = bench_common.run_result(launch + [os.path.join(a.build, "pp_bench")] + common)
                loss_diff = max(abs(x - y) for x, y in zip(ours_r["losses"], torch_r["losses"]))
                rows.append((shape, schedule, ours_r, torch_r, loss_diff))
    print(f"{'shape':6s} {'schedule':17s} {'ours ms':>8s} {'torch ms':>8s} {'time':>6s} {'ours MiB':>8s} "
          f"{'torch MiB':>9s} {'memory':>6s} {'bubble':>7s} {'figure':>7s} {'|loss diff|':>11s}")
    mib = 1024 * 1024
    for shape, schedule, o, t, d in rows:
        print(f"{shape:6s} {schedule:17s} {o['step_ms']:8.1f} {t['step_ms']:8.1f} {o['step_ms'] / t['step_ms']:5.2f}x "
              f"{o['peak_bytes'] / mib:8.1f} {t['peak_bytes'] / mib:9.1f} {o['peak_bytes'] / t['peak_bytes']:5.2f}x "
              f"{100 * o['bubble']:6.1f}% {100 * o['nominal_bubble']:6.1f}% {d:11.2e}")
    if a.plot:
        plot(rows, a.plot)


def plot(rows, path):
    """Our step time and peak memory over PyTorch's, per shape and schedule."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = list(dict.fromkeys(r[0] for r in rows))
    schedules = list(dict.fromkeys(r[1] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), constrained_layout=True)
    width = 0.8 / len(schedules)
    for ax, key, title in [(axes[0], "step_ms", "step time, ours / PyTorch's"),
                           (axes[1], "peak_bytes", "peak memory per rank, ours / PyTorch's")]:
        for k, schedule in enumerate(schedules):
            values = [next(o[key] / t[key] for s, sc, o, t, _ in rows if s == shape and sc == schedule)
                      for shape in shapes]
            ax.bar([i + k * width for i in range(len(shapes))], values, width, label=schedule)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(schedules) - 1) / 2 for i in range(len(shapes))], shapes)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("pipeline parallelism on 2 CPU ranks: shardtrain vs torch.distributed.pipelining")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
