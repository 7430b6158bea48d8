"""Our tensor parallelism against PyTorch's (parallelize_module + fully_shard, on transformers' LlamaForCausalLM)
on the same Llama, weights and batches, in one run: step time and peak CPU memory per rank (shardtrain's counting
allocator on both sides), their ratios, and the losses side by side. Shapes are swept (each a llama-debug with
model.overrides); layouts tp 2 at world size 2 and dp 2 x tp 2 at world size 4, each without and with sequence
parallelism on both sides (PyTorch's torchtitan-style plan: SequenceParallel norms, PrepareModuleInput gathering
each region's input). --plot FILE draws the ratios (docs/notes/figures/tp-vs-torch.png).

    .venv/bin/python bench/tp_vs_torch.py [--build build] [--steps 8] [--shapes small,wide] [--plot FILE]

On CPU the ranks of one machine share its cores: the ratios compare the two implementations, not what tensor
parallelism pays on a GPU node (docs/notes/benchmarks.md).
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
    "long": ("dim=256,layers=2,heads=4,kv_heads=2,mlp_dim=688,vocab_size=8000,max_positions=1024", 2, 1024),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--shapes", default="small,wide,long")
    p.add_argument("--plot", default=None)
    a = p.parse_args()
    launcher = os.path.join(a.build, "shardtrain")
    ours = os.path.join(a.build, "tp_bench")
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for shape in a.shapes.split(","):
        overrides, batch, seq = SHAPES[shape]
        with tempfile.TemporaryDirectory(prefix="shardtrain-tp-bench-") as inputs:
            subprocess.run([ours, "--write-inputs", inputs, "--flavor", "llama-debug", "--overrides", overrides,
                            "--batch", str(batch), "--seq", str(seq), "--steps", str(a.steps)], check=True)
            for world, tp in ((2, 2), (4, 2)):
                def launch(cmd):
                    return [launcher, "launch", "--nproc-per-node", str(world), "--"] + cmd

                print(f"  {shape}: W={world} tp={tp}", file=sys.stderr, flush=True)
                for sp in (False, True):
                    flag = ["--sequence-parallel"] if sp else []
                    torch_r = bench_common.run_result(launch(
                        [sys.executable, os.path.join(here, "tp_reference.py"), "--inputs", inputs, "--memhook",
                         memhook, "--tp", str(tp), "--steps", str(a.steps)] + flag))
                    ours_r = bench_common.run_result(launch(
                        [ours, "--inputs", inputs, "--tp", str(tp), "--steps", str(a.steps)] + flag))
                    loss_diff = max(abs(x - y) for x, y in zip(ours_r["losses"], torch_r["losses"]))
                    rows.append((shape, world, tp, sp, ours_r, torch_r, loss_diff))
    print(f"{'shape':6s} {'W':>2s} {'dp x tp':>8s} {'seq-par':>7s} {'ours ms':>8s} {'torch ms':>8s} {'time':>6s} "
          f"{'ours MiB':>8s} {'torch MiB':>9s} {'memory':>6s} {'|loss diff|':>11s}")
    for shape, world, tp, sp, o, t, d in rows:
        mib = 1024 * 1024
        print(f"{shape:6s} {world:2d} {f'{world // tp} x {tp}':>8s} {'yes' if sp else 'no':>7s} {o['step_ms']:8.1f} "
              f"{t['step_ms']:8.1f} {o['step_ms'] / t['step_ms']:5.2f}x {o['peak_bytes'] / mib:8.1f} "
              f"{t['peak_bytes'] / mib:9.1f} {o['peak_bytes'] / t['peak_bytes']:5.2f}x {d:11.2e}")
    if a.plot:
        plot(rows, a.plot)


def plot(rows, path):
    """Our step time and peak memory over PyTorch's, per shape and layout, without and with sequence parallelism."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = sorted({(shape, world, tp) for shape, world, tp, *_ in rows}, key=lambda k: (k[1], k[0]))
    xs = range(len(labels))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), constrained_layout=True)
    for ax, key, goal, title in [(axes[0], "step_ms", 0.90, "step time, ours / PyTorch's"),
                                 (axes[1], "peak_bytes", 1.00, "peak memory per rank, ours / PyTorch's")]:
        for offset, sp, name in [(-0.2, False, "tensor parallel"), (0.2, True, "+ sequence parallel")]:
            ratios = [next(o[key] / t[key] for s, w, tp, p, o, t, _ in rows if (s, w, tp) == label and p == sp)
                      for label in labels]
            bars = ax.bar([x + offset for x in xs], ratios, 0.4, label=name)
            for bar, r in zip(bars, ratios):
                ax.annotate(f"{r:.2f}", (bar.get_x() + bar.get_width() / 2, r), ha="center", va="bottom", fontsize=8)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(goal, color="tab:red", linewidth=0.8, linestyle="--", label=f"goal {goal:.2f}x")
        ax.set_xticks(list(xs), [f"{s}\n{w // tp} x tp {tp}" for s, w, tp in labels], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("shardtrain's tensor parallelism vs PyTorch's (parallelize_module + fully_shard), Llama, CPU/Gloo")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
