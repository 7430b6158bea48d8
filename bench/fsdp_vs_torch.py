"""Our runtime against plain LibTorch and against PyTorch's own FSDP2 and DDP, on one model, batch and set of
initial weights, in one run. Prints step time and peak CPU memory per rank (both counted by shardtrain's own
allocator) and their ratios, and checks the numerics: our losses against PyTorch's, step for step.

    .venv/bin/python bench/fsdp_vs_torch.py [--build build] [--steps 20] [--dim 384] [--blocks 6] [--batch 64]
                                            [--ac-batch 1024] [--plot docs/notes/figures/fsdp-vs-torch.png]

--plot draws the comparisons with PyTorch as bars (step time and peak memory, ours beside PyTorch's, per
configuration) into a PNG and an SVG of the same name.

A second section trains the same model on a larger batch (--ac-batch), where activations outweigh the model
state, with and without activation checkpointing of every block: what checkpointing saves and costs, ours beside
PyTorch's (torch.utils.checkpoint, non-reentrant, under FSDP2).

Every configuration is launched through `shardtrain launch` (PyTorch's too), on CPU with Gloo; with several ranks
on one machine the ranks share its cores, so absolute times say little, ratios between runs of the same world
size do.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import bench_common


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ac-batch", type=int, default=1024)
    p.add_argument("--plot", help="a .png to draw the comparisons into (an .svg beside it)")
    a = p.parse_args()
    launcher = os.path.join(a.build, "shardtrain")
    ours = os.path.join(a.build, "fsdp_bench")
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    sizes = ["--dim", str(a.dim), "--blocks", str(a.blocks), "--batch", str(a.batch), "--steps", str(a.steps)]
    ac_sizes = ["--dim", str(a.dim), "--blocks", str(a.blocks), "--batch", str(a.ac_batch), "--steps", str(a.steps)]
    with tempfile.TemporaryDirectory(prefix="shardtrain-bench-") as inputs, \
            tempfile.TemporaryDirectory(prefix="shardtrain-bench-ac-") as ac_inputs:
        subprocess.run([ours, "--write-inputs", inputs] + sizes, check=True)
        subprocess.run([ours, "--write-inputs", ac_inputs] + ac_sizes, check=True)
        results = {}

        # section "main": the batch of --batch; "ac": the batch of --ac-batch, with or without checkpointing
        def go(impl, mode, world, section, checkpoint=False):
            data, size_args = (ac_inputs, ac_sizes) if section == "ac" else (inputs, sizes)
            extra = ["--checkpoint"] if checkpoint else []
            if impl == "shardtrain":
                cmd = [launcher, "launch", "--nproc-per-node", str(world), "--", ours, "--mode", mode, "--inputs", data]
            else:
                cmd = [launcher, "launch", "--nproc-per-node", str(world), "--", sys.executable,
                       os.path.join(here, "torch_reference.py"), "--mode", mode, "--inputs", data, "--memhook", memhook]
            print(f"  running {impl:10s} {mode:13s} W={world} {size_args[5]:>5s} rows{' checkpointed' if checkpoint else ''}",
                  file=sys.stderr, flush=True)
            results[(impl, mode, world, section, checkpoint)] = bench_common.run_result(cmd + size_args + extra)

        for impl, mode, world in [("shardtrain", "plain", 1), ("shardtrain", "full_shard", 1), ("torch", "plain", 1),
                                  ("shardtrain", "full_shard", 2), ("torch", "full_shard", 2),
                                  ("shardtrain", "shard_grad_op", 2), ("torch", "shard_grad_op", 2),
                                  ("shardtrain", "ddp", 2), ("torch", "ddp", 2),
                                  ("shardtrain", "ddp_bucket_view", 2), ("torch", "ddp_bucket_view", 2)]:
            go(impl, mode, world, "main")
        for impl, mode, world in [("shardtrain", "plain", 1), ("shardtrain", "full_shard", 2), ("torch", "full_shard", 2)]:
            for checkpoint in (False, True):
                go(impl, mode, world, "ac", checkpoint)

    params = a.dim * a.dim * 2 + a.dim * 2 + 2 * a.dim + a.blocks * (8 * a.dim * a.dim + 5 * a.dim + 2 * a.dim)
    print(f"\nmodel: {a.blocks} blocks, dim {a.dim}, {params / 1e6:.2f}M parameters; batch {a.batch}; AdamW; "
          f"{a.steps} timed steps (median); peak = most CPU bytes live on any rank during the timed steps\n")
    print(f"{'run':38s} {'step ms':>9s} {'peak MB':>9s} {'time ratio':>11s} {'mem ratio':>10s} {'max loss diff':>14s}")

    def row(label, ours_key, base_key):
        o, b = results[ours_key], results[base_key]
        diff = max(abs(x - y) / abs(y) for x, y in zip(o["losses"], b["losses"]))
        print(f"{label:38s} {o['step_ms']:9.1f} {o['peak_bytes'] / 2**20:9.1f} {o['step_ms'] / b['step_ms']:10.2f}x "
              f"{o['peak_bytes'] / b['peak_bytes']:9.2f}x {diff:14.2e}")

    def base(label, key):
        r = results[key]
        print(f"{label:38s} {r['step_ms']:9.1f} {r['peak_bytes'] / 2**20:9.1f}")

    base("LibTorch plain W=1", ("shardtrain", "plain", 1, "main", False))
    plain = ("shardtrain", "plain", 1, "main", False)
    row("  ours FULL_SHARD W=1 vs plain", ("shardtrain", "full_shard", 1, "main", False), plain)
    row("  PyTorch plain W=1 vs LibTorch plain", ("torch", "plain", 1, "main", False), plain)
    torch_names = {"full_shard": "FSDP2 reshard", "shard_grad_op": "FSDP2 no reshard", "ddp": "DDP",
                   "ddp_bucket_view": "DDP bucket views"}
    for mode, name in [("full_shard", "FULL_SHARD"), ("shard_grad_op", "SHARD_GRAD_OP"), ("ddp", "DDP"),
                       ("ddp_bucket_view", "DDP bucket views")]:
        torch_name = torch_names[mode]
        base(f"PyTorch {torch_name} W=2", ("torch", mode, 2, "main", False))
        row(f"  ours {name} W=2 vs PyTorch", ("shardtrain", mode, 2, "main", False), ("torch", mode, 2, "main", False))

    # Where the memory goes: the peak of each phase of a step (the counter restarts at each phase's start).
    print(f"\npeak MB by phase of a step, largest rank:\n")
    print(f"{'run':38s} {'forward':>9s} {'backward':>9s} {'opt step':>9s}")
    for label, impl, mode, world in [("LibTorch plain W=1", "shardtrain", "plain", 1),
                                     ("PyTorch plain W=1", "torch", "plain", 1),
                                     ("ours FULL_SHARD W=1", "shardtrain", "full_shard", 1),
                                     ("PyTorch FSDP2 reshard W=2", "torch", "full_shard", 2),
                                     ("ours FULL_SHARD W=2", "shardtrain", "full_shard", 2),
                                     ("PyTorch FSDP2 no reshard W=2", "torch", "shard_grad_op", 2),
                                     ("ours SHARD_GRAD_OP W=2", "shardtrain", "shard_grad_op", 2),
                                     ("PyTorch DDP W=2", "torch", "ddp", 2),
                                     ("ours DDP W=2", "shardtrain", "ddp", 2),
                                     ("PyTorch DDP bucket views W=2", "torch", "ddp_bucket_view", 2),
                                     ("ours DDP bucket views W=2", "shardtrain", "ddp_bucket_view", 2)]:
        phases = results[(impl, mode, world, "main", False)]["phase_peak_bytes"]
        print(f"{label:38s} " + " ".join(f"{b / 2**20:9.1f}" for b in phases))

    print(f"\nactivation checkpointing of every block, batch {a.ac_batch}:\n")
    print(f"{'run':38s} {'step ms':>9s} {'peak MB':>9s} {'time ratio':>11s} {'mem ratio':>10s} {'max loss diff':>14s}")
    base("LibTorch plain W=1", ("shardtrain", "plain", 1, "ac", False))
    row("  ours checkpointed W=1 vs plain", ("shardtrain", "plain", 1, "ac", True),
        ("shardtrain", "plain", 1, "ac", False))
    base("ours FULL_SHARD W=2", ("shardtrain", "full_shard", 2, "ac", False))
    row("  ours FULL_SHARD+AC W=2 vs FULL_SHARD", ("shardtrain", "full_shard", 2, "ac", True),
        ("shardtrain", "full_shard", 2, "ac", False))
    base("PyTorch FSDP2 reshard W=2", ("torch", "full_shard", 2, "ac", False))
    row("  PyTorch FSDP2+AC W=2 vs FSDP2", ("torch", "full_shard", 2, "ac", True),
        ("torch", "full_shard", 2, "ac", False))
    row("  ours FULL_SHARD+AC W=2 vs FSDP2+AC", ("shardtrain", "full_shard", 2, "ac", True),
        ("torch", "full_shard", 2, "ac", True))
    if a.plot:
        pairs = [(name, ("shardtrain", mode, 2, "main", False), ("torch", mode, 2, "main", False))
                 for mode, name in [("full_shard", "FULL_SHARD"), ("shard_grad_op", "SHARD_GRAD_OP"), ("ddp", "DDP"),
                                    ("ddp_bucket_view", "DDP bucket views")]]
        pairs.append((f"FULL_SHARD+AC\n(batch {a.ac_batch})", ("shardtrain", "full_shard", 2, "ac", True),
                      ("torch", "full_shard", 2, "ac", True)))
        plot_pairs(pairs, results, a.plot, f"{a.blocks} blocks, dim {a.dim}, {params / 1e6:.2f}M parameters, W=2, CPU")


def plot_pairs(pairs, results, path, subtitle):
    """Ours beside PyTorch's, per configuration: median step time and peak memory of the largest rank."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [p[0] for p in pairs]
    xs = range(len(pairs))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for ax, key, scale, unit in [(axes[0], "step_ms", 1.0, "step time (ms, median)"),
                                 (axes[1], "peak_bytes", 1.0 / 2**20, "peak memory per rank (MiB)")]:
        ours = [results[o][key] * scale for _, o, _ in pairs]
        theirs = [results[t][key] * scale for _, _, t in pairs]
        ax.bar([x - 0.2 for x in xs], ours, 0.4, label="shardtrain")
        ax.bar([x + 0.2 for x in xs], theirs, 0.4, label="PyTorch (FSDP2 / DDP)")
        for x, o, t in zip(xs, ours, theirs):
            ax.annotate(f"{o / t:.2f}x", (x - 0.2, o), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel(unit)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"shardtrain vs PyTorch: {subtitle} (ours / theirs above our bars)")
    fig.savefig(path, dpi=110)
    fig.savefig(os.path.splitext(path)[0] + ".svg")
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
