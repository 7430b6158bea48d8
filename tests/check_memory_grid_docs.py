"""The memory model's accuracy as the guide states it comes from the recorded grid, and the record is of the grid the
benchmark runs now: docs/notes/memory-model-grid.csv must hold exactly bench/memory_model.py's cells (rerun it when
the grid changes: `.venv/bin/python bench/memory_model.py --build build --csv docs/notes/memory-model-grid.csv`),
and docs/guide/planning.md and docs/guide/fine-tuning.md must state the counts and errors computed from it, in the
words below (printed when they do not).

    python tests/check_memory_grid_docs.py    # exit 1 naming what is stale
"""
import csv
import importlib.util
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CSV = os.path.join(ROOT, "docs", "notes", "memory-model-grid.csv")
PHASES = ["forward", "backward", "step"]


def bench_cells():
    spec = importlib.util.spec_from_file_location("memory_model", os.path.join(ROOT, "bench", "memory_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [tuple(str(x) for x in cell[:6]) + tuple(str(x) for x in module.options(cell))
            for cell in module.grid(False)]


def peak_error(row):
    """Predicted over measured peak, minus 1, in percent."""
    measured = max(int(row[p + "_measured"]) for p in PHASES)
    predicted = max(int(row[p + "_predicted"]) for p in PHASES)
    return (predicted / measured - 1) * 100


def statement(rows, what):
    if not rows:
        return f"no {what}"
    errors = [peak_error(r) for r in rows]
    mean = sum(abs(e) for e in errors) / len(errors)
    return f"{len(rows)} {what}, every peak from {min(errors):+.1f}% to {max(errors):+.1f}% of measured ({mean:.2f}% " \
           f"off on average)"


def main():
    with open(CSV, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keys = ["model", "strategy", "world", "batch", "precision", "ac", "grad_accum", "tokens", "lora"]
    recorded = [tuple(r.get(k, "") for k in keys) for r in rows]
    failures = []
    expected = bench_cells()
    if sorted(recorded) != sorted(expected):
        missing = sorted(set(expected) - set(recorded))
        extra = sorted(set(recorded) - set(expected))
        failures.append(f"docs/notes/memory-model-grid.csv has {len(recorded)} cells, bench/memory_model.py's grid {len(expected)}: "
                        f"{len(missing)} not recorded (first: {missing[:1]}), {len(extra)} no longer in the grid "
                        f"(first: {extra[:1]}); run the grid again")
    pages = {"planning.md": statement(rows, "cells"),
             "fine-tuning.md": statement([r for r in rows if r.get("lora")], "LoRA cells")}
    for page, words in pages.items():
        with open(os.path.join(ROOT, "docs", "guide", page), encoding="utf-8") as f:
            text = " ".join(f.read().split())
        if words not in text:
            failures.append(f"docs/guide/{page} does not say: {words}")
    for failure in failures:
        print(failure)
    if failures:
        return 1
    print(f"docs/guide: {pages['planning.md']}; {pages['fine-tuning.md']} (docs/notes/memory-model-grid.csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
