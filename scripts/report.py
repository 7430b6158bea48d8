#!/usr/bin/env python3
"""The report of one or more `shardtrain train` runs, drawn with matplotlib from what each run wrote in its log.dir
(metrics.csv, eval.csv): each loss on a log scale, the held-out evaluation, items/s and MFU, and peak memory per
rank, over the steps. Several runs are drawn in the same panels, one colour each (comparing strategies or
precisions). Writes OUT/report.png and OUT/report.svg; OUT is the first run's directory unless --out says.

    scripts/report.py runs/flava-debug [runs/other ...] [--out DIR]
(`shardtrain report` runs this script.)
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

# metrics.csv's columns before the task's losses (MetricsLog in lib/train/src/train/metrics_log.cpp).
FIXED = {"step", "loss", "lr", "grad_norm", "items_per_s", "texts_per_s", "images_per_s", "tflops_per_rank", "mfu",
         "peak_memory_gib", "peak_memory_gib_by_rank"}


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def series(rows, column, transform=float):
    """(steps, values) of the rows where `column` has a value."""
    steps, values = [], []
    for r in rows:
        v = r.get(column)
        if v not in (None, ""):
            steps.append(float(r["step"]))
            values.append(transform(v))
    return steps, values


def load(run):
    metrics = read_csv(os.path.join(run, "metrics.csv"))
    if not metrics:
        sys.exit(f"report: {run} has no metrics.csv (is it a run's log.dir?)")
    return {"name": os.path.basename(os.path.normpath(run)), "metrics": metrics,
            "eval": read_csv(os.path.join(run, "eval.csv")),
            "losses": [c for c in metrics[0].keys() if c not in FIXED]}


def draw(runs, out):
    several = len(runs) > 1
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), constrained_layout=True)
    (ax_loss, ax_eval), (ax_speed, ax_memory) = axes
    ax_mfu = ax_speed.twinx()
    for i, run in enumerate(runs):
        colour = colours[i % len(colours)]
        tag = f"{run['name']}: " if several else ""
        # Losses: the total, and (one run) each objective's, on a log scale.
        ax_loss.plot(*series(run["metrics"], "loss"), color=colour, lw=2, label=tag + "loss")
        if not several:
            for j, name in enumerate(run["losses"]):
                ax_loss.plot(*series(run["metrics"], name), lw=1, color=colours[(j + 1) % len(colours)], label=name)
        # Held-out evaluation: whatever the task reports (FLAVA: R@1 both ways, ITM accuracy).
        if run["eval"]:
            # The metrics, not how many samples they were measured on.
            names = [c for c in run["eval"][0].keys() if c != "step" and not c.endswith("samples")]
            for j, name in enumerate(names):
                style = ["-", "--", ":", "-."][j % 4]
                ax_eval.plot(*series(run["eval"], name), marker="o", ms=3, ls=style,
                             color=colour if several else colours[j % len(colours)], label=tag + name)
        # Throughput and MFU (warm-up intervals have no value).
        ax_speed.plot(*series(run["metrics"], "items_per_s"), color=colour, label=tag + "items/s")
        ax_mfu.plot(*series(run["metrics"], "mfu", lambda v: 100 * float(v)), color=colour, ls="--",
                    label=tag + "MFU")
        # Peak memory since the start, each rank (older runs: the largest over the ranks).
        by_rank = [r for r in run["metrics"] if r.get("peak_memory_gib_by_rank")]
        if by_rank:
            ranks = len(by_rank[0]["peak_memory_gib_by_rank"].split(";"))
            for rank in range(ranks):
                ax_memory.plot(*series(by_rank, "peak_memory_gib_by_rank", lambda v: float(v.split(";")[rank])),
                               color=colour, alpha=1.0 - 0.5 * rank / max(ranks, 1), label=f"{tag}rank {rank}")
        else:
            ax_memory.plot(*series(run["metrics"], "peak_memory_gib"), color=colour, label=tag + "largest rank")
    ax_loss.set(title="training losses", xlabel="step", ylabel="loss", yscale="log")
    ax_eval.set(title="held-out evaluation", xlabel="step", ylabel="value")
    ax_speed.set(title="throughput", xlabel="step", ylabel="items/s")
    ax_mfu.set_ylabel("MFU (%), dashed")
    ax_memory.set(title="peak memory per rank", xlabel="step", ylabel="GiB")
    ax_memory.set_ylim(bottom=0)
    ax_eval.set_ylim(bottom=0)
    for ax in (ax_loss, ax_eval, ax_speed, ax_memory):
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    if not run["eval"] and not any(r["eval"] for r in runs):
        ax_eval.text(0.5, 0.5, "no data.eval in these runs", ha="center", va="center", transform=ax_eval.transAxes)
    fig.suptitle(" vs ".join(r["name"] for r in runs))
    os.makedirs(out, exist_ok=True)
    written = []
    for ext in ("png", "svg"):
        path = os.path.join(out, f"report.{ext}")
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="a run's log.dir (holding metrics.csv)")
    parser.add_argument("--out", help="where report.png and report.svg go (default: the first run's directory)")
    args = parser.parse_args()
    runs = [load(r) for r in args.runs]
    for path in draw(runs, args.out or args.runs[0]):
        print(f"report: {path}")


if __name__ == "__main__":
    main()
