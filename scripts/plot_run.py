#!/usr/bin/env python3
"""Plots a `shardtrain train` run: the losses of metrics.csv and the held-out metrics of eval.csv, side by side,
as one SVG (no plotting library needed).  Usage: scripts/plot_run.py runs/flava-debug  ->  runs/flava-debug/curves.svg
"""
import csv
import math
import os
import sys

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
W, H, PAD = 460, 300, 50


def read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def panel(x0, title, rows, columns, log_scale):
    series = []
    for name in columns:
        points = [(float(r["step"]), float(r[name])) for r in rows if r.get(name) not in (None, "")]
        if log_scale:
            points = [(s, math.log10(v)) for s, v in points if v > 0]
        if points:
            series.append((name, points))
    out = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<rect x="{x0 + PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="none" stroke="#999"/>']
    if not series:
        return out
    xs = [s for _, p in series for s, _ in p]
    ys = [v for _, p in series for _, v in p]
    x_lo, x_hi = min(xs), max(xs) or 1
    y_lo, y_hi = min(ys), max(ys)
    if y_hi == y_lo:
        y_hi = y_lo + 1
    sx = lambda s: x0 + PAD + (s - x_lo) / max(x_hi - x_lo, 1) * (W - 2 * PAD)
    sy = lambda v: H - PAD - (v - y_lo) / (y_hi - y_lo) * (H - 2 * PAD)
    label = (lambda v: f"{10 ** v:.3g}") if log_scale else (lambda v: f"{v:.3g}")
    for v in (y_lo, (y_lo + y_hi) / 2, y_hi):
        out.append(f'<text x="{x0 + PAD - 4}" y="{sy(v) + 4}" text-anchor="end" font-size="10">{label(v)}</text>')
    for s in (x_lo, x_hi):
        out.append(f'<text x="{sx(s)}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">step {s:.0f}</text>')
    for i, (name, points) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        out.append(f'<text x="{x0 + W - PAD + 4}" y="{PAD + 12 * i + 8}" font-size="10" fill="{colour}">{name}</text>')
    return out


def main(run_dir):
    metrics = read(os.path.join(run_dir, "metrics.csv"))
    evals = read(os.path.join(run_dir, "eval.csv"))
    if not metrics:
        sys.exit(f"no metrics.csv in {run_dir}")
    losses = [c for c in metrics[0].keys() if c not in
              ("step", "lr", "grad_norm", "items_per_s", "texts_per_s", "images_per_s", "tflops_per_rank", "mfu",
               "peak_memory_gib")]
    eval_columns = [c for c in (evals[0].keys() if evals else []) if c not in ("step", "eval_samples")]
    body = panel(0, "training losses (log scale)", metrics, losses, True)
    body += panel(W + 60, "held-out: retrieval R@1, ITM accuracy", evals, eval_columns, False)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 120}" height="{H}" font-family="sans-serif">'
           f'<rect width="100%" height="100%" fill="white"/>{"".join(body)}</svg>\n')
    out = os.path.join(run_dir, "curves.svg")
    with open(out, "w") as f:
        f.write(svg)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/flava-debug")
