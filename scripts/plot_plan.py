"""Draws `shardtrain plan --figure flava|t5 --json` as a grouped bar chart (SVG or PNG, by the output's suffix).

usage: shardtrain plan --figure flava --json > flava.json && scripts/plot_plan.py flava.json flava.svg
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        fig_data = json.load(f)
    rows = fig_data["rows"]
    label_key = "flavor" if fig_data["figure"] == "flava" else "precision"
    series = [k for k in rows[0] if k != label_key]
    labels = [r[label_key] for r in rows]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, name in enumerate(series):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(rows))]
        values = [r[name] for r in rows]
        bars = ax.bar(xs, values, width, label=name.replace("_", " "))
        for x, v in zip(xs, values):
            ax.annotate(str(v) if v else "no fit", (x, max(v, 1)), ha="center", va="bottom", fontsize=8)
        del bars
    ax.set_xticks(range(len(rows)), labels)
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.7)  # room for the "no fit" labels of zero bars
    ax.set_ylabel("max local batch (predicted)")
    title = {"flava": "FLAVA: max local batch per GPU", "t5": "T5-3B: default vs transformer wrapping"}
    ax.set_title(f"{title[fig_data['figure']]} ({fig_data['setting']})", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend()
    agree = [("agrees" if f["agrees"] else "disagrees") + ": " + f["finding"] for f in fig_data.get("findings", [])]
    fig.text(0.01, 0.01, "\n".join(agree), fontsize=6.5, va="bottom")
    fig.subplots_adjust(bottom=0.12 + 0.028 * len(agree))
    fig.savefig(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
