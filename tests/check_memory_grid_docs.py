"""The memory model's accuracy as the guide states it comes from the recorded grid, and the record is of the grid the
benchmark runs now: docs/notes/memory-model-grid.csv must hold exactly bench/memory_model.py's cells (rerun it when
the grid changes: `.venv/bin/python bench/memory_model.py --build build --csv docs/notes/memory-model-grid.csv`),
and docs/guide/planning.md and docs/guide/fine-tuning.md must state the counts and errors computed from it, in the
words below (printed when they do not). Likewise the LoRA, tensor-parallel and offload sets (--lora, --tp,
--offload: docs/notes/memory-model-{lora,tp,offload}.csv), whose counts docs/notes/memory-model.md states, and the
number of cells the quick grid (ctest plan.memory_model_grid) measures.

    python tests/check_memory_grid_docs.py    # exit 1 naming what is stale
"""
import csv
import importlib.util
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CSV = os.path.join(ROOT, "docs", "notes", "memory-model-grid.csv")
PHASES = ["forward", "backward", "step"]
KEYS = ["model", "strategy", "world", "batch", "precision", "ac", "grad_accum", "tokens", "lora"]


def bench_module():
    spec = importlib.util.spec_from_file_location("memory_model", os.path.join(ROOT, "bench", "memory_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The columns a set records beyond KEYS, and where a cell holds them.
EXTRA = {"tp": 9, "offload": 10}


def cell_keys(module, cells, extra=()):
    """A cell as its CSV row names it: (model, strategy, world, batch, precision, ac, grad_accum, tokens, lora[, tp]
    [, offload])."""
    return [tuple(str(x) for x in cell[:6]) + tuple(str(x) for x in module.options(cell)) +
            tuple(str(cell[EXTRA[k]]) if len(cell) > EXTRA[k] else "" for k in extra) for cell in cells]


def recorded_keys(path, extra=()):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keys = KEYS + list(extra)
    return rows, [tuple(r.get(k, "") for k in keys) for r in rows]


def compare(name, recorded, expected):
    """A failure naming what differs between a CSV's cells and the benchmark's, or None."""
    if sorted(recorded) == sorted(expected):
        return None
    missing = sorted(set(expected) - set(recorded))
    extra = sorted(set(recorded) - set(expected))
    return (f"docs/notes/{name} has {len(recorded)} cells, bench/memory_model.py's {len(expected)}: {len(missing)} not "
            f"recorded (first: {missing[:1]}), {len(extra)} no longer in the grid (first: {extra[:1]}); run it again")


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


def says(path, words):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return words in " ".join(f.read().split())


def main():
    module = bench_module()
    rows, recorded = recorded_keys(CSV)
    failures = [compare("memory-model-grid.csv", recorded, cell_keys(module, module.grid(False)))]
    # The other recorded sets, each the cells its flag runs, and the counts docs/notes/memory-model.md gives.
    for name, cells, extra, words in [
            ("memory-model-lora.csv", module.lora_cells(), (), None),
            ("memory-model-tp.csv", module.tp_cells(), ("tp",), "`bench/memory_model.py --tp` ({} cells:"),
            ("memory-model-offload.csv", module.offload_cells(), ("offload",),
             "`bench/memory_model.py --offload` ({} cells:")]:
        _, keys = recorded_keys(os.path.join(ROOT, "docs", "notes", name), extra)
        failures.append(compare(name, keys, cell_keys(module, cells, extra)))
        if words and not says("docs/notes/memory-model.md", words.format(len(cells))):
            failures.append(f"docs/notes/memory-model.md does not say: {words.format(len(cells))}")
    quick = f"measures {len(module.grid(True))} cells"
    if not says("docs/notes/memory-model.md", quick):
        failures.append(f"docs/notes/memory-model.md does not say how many cells the quick grid has: {quick}")
    failures = [f for f in failures if f]
    pages = {"planning.md": statement(rows, "cells"),
             "fine-tuning.md": statement([r for r in rows if r.get("lora")], "LoRA cells")}
    for page, words in pages.items():
        if not says(os.path.join("docs", "guide", page), words):
            failures.append(f"docs/guide/{page} does not say: {words}")
    for failure in failures:
        print(failure)
    if failures:
        return 1
    print(f"docs/guide: {pages['planning.md']}; {pages['fine-tuning.md']} (docs/notes/memory-model-grid.csv)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
