"""The memory model against measurement: real training steps over a grid of models and configurations.

Each cell runs build/memory_model_bench under `shardtrain launch` (the trainer's own ParallelModel and AdamW,
synthetic batches of the task's largest kind): every rank's peak in each phase of a step (forward with the loss,
backward, clipping + AdamW + zero_grad) counted by our allocator, the largest rank's, against
`plan::estimate_training_memory`'s prediction for the same job. Prints predicted vs measured and the error per
cell, then the largest errors.

Models: one per family at a few tens of millions of parameters or less (config.json files written here; Llama's
decoder also as Qwen3 and Mistral; GPT-2), text at 64 tokens (ViT and FLAVA at 128-pixel images, 64 patches), and the
text families at realistic lengths (512 tokens for BERT, 1024 for the decoders and T5), where attention's (T, T)
tensors, the masks and a layer's temporaries count.

usage: memory_model.py [--quick | --lora | --tp | --offload] [--only TEXT] [--check [UNDER:]OVER] [--csv FILE]
                       [--build DIR]
  --quick   the subset tests/CMakeLists.txt runs (plan.memory_model_grid)
  --lora    the LoRA cells alone (docs/notes/memory-model-lora.csv)
  --tp      the tensor-parallel cells alone (docs/notes/memory-model-tp.csv)
  --offload the offload cells alone (docs/notes/memory-model-offload.csv): CPU offload's and activation offload's;
            the compute tier's phases as a GPU's, and the host tier (the offloaded shards, gradients and optimizer
            state, the layers' activations; counted apart) as a fourth
  --only    the cells whose row starts with TEXT (words separated by spaces or commas: "vit,full_shard,2")
Cells: (family, strategy, world, batch per rank, precision, checkpointing[, micro-batches[, tokens[, LoRA[, TP[,
offload]]]]]), TP "2" (tensor parallel over 2 of the world's ranks, the strategy over the rest) or "2:sp" (sequence
parallel too), offload "cpu", "activations", "cpu+activations" or "nvme".
  --check   exit 1 when a cell's prediction of any phase (forward, backward, step; host, offloaded) is off by more
            than the bound:
            UNDER:OVER (0.03:0.08 = at most 3% below, 8% above measured; an underestimate is the one that runs out
            of memory), or TOLERANCE either way (0.10 = 10%)
"""
import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = {
    "bert": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 8000, "hidden_size": 256,
             "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
             "max_position_embeddings": 512},
    "llama": {"model_type": "llama", "vocab_size": 8000, "hidden_size": 256, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688,
              "max_position_embeddings": 2048},
    # Llama's decoder as Qwen3 (q/k norms, heads of 96 for a width of 256 over 4, the head tied: one table in the
    # root) and as Mistral (a window of 32 positions, shorter than the 64 tokens: an explicit band mask).
    "qwen3": {"model_type": "qwen3", "vocab_size": 8000, "hidden_size": 256, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 96, "intermediate_size": 688,
              "max_position_embeddings": 2048, "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "vocab_size": 8000, "hidden_size": 256, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688,
                "max_position_embeddings": 2048, "sliding_window": 32},
    # GPT-2 as its config.json says it (dropout 0.1 on the embeddings, attention and each sub-layer's output).
    "gpt2": {"model_type": "gpt2", "vocab_size": 8000, "n_embd": 256, "n_layer": 4, "n_head": 4,
             "n_positions": 1024},
    "vit": {"model_type": "vit", "architectures": ["ViTForImageClassification"], "image_size": 128, "patch_size": 16,
            "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 1536,
            "id2label": {str(i): str(i) for i in range(10)}},
    "t5": {"model_type": "t5", "vocab_size": 8000, "d_model": 256, "d_kv": 64, "d_ff": 1024, "num_layers": 4,
           "num_heads": 4},
    "flava": {"model_type": "flava", "hidden_size": 256, "projection_dim": 256,
              "text_config": {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                              "num_hidden_layers": 4, "vocab_size": 8000, "max_position_embeddings": 128},
              "image_config": {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                               "num_hidden_layers": 4, "image_size": 128, "patch_size": 16},
              "multimodal_config": {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4,
                                    "num_hidden_layers": 2}},
}
# Larger models for the cells that need one (not the whole grid): BERT at 27.9M parameters, 112 MB of float32
# gradients, five DDP buckets of 25 MiB or more.
LARGER_MODELS = {
    "bert-28m": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 16000, "hidden_size": 512,
                 "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
                 "max_position_embeddings": 512},
    # A vocabulary small against the width, with grouped-query attention (16 heads, 4 key/value): the layers, not
    # the loss, set the peak, and a layer's forward temporaries show.
    "llama-wide": {"model_type": "llama", "vocab_size": 2048, "hidden_size": 1024, "num_hidden_layers": 4,
                   "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
                   "max_position_embeddings": 2048},
}
STRATEGIES = ["full_shard", "shard_grad_op", "no_shard", "ddp"]
PHASES = ["forward", "backward", "step"]
Cell = collections.namedtuple("Cell", "family strategy world batch precision ac grad_accum tokens lora tp offload",
                              defaults=(1, 64, "", "", ""))
# A cell's offload: "" none, "cpu" (parallel.cpu_offload), "activations" (parallel.activation_offload), both
# ("cpu+activations"), or "nvme" (parallel.offload: nvme, the disk tier).


def grid(quick):
    """(family, strategy, world, batch, precision, ac[, grad_accum]) cells."""
    if quick:
        return [("bert", "full_shard", 2, 4, "no", False), ("bert", "ddp", 2, 4, "no", True),
                ("llama", "shard_grad_op", 2, 4, "bf16", False), ("llama", "full_shard", 3, 2, "no", True),
                ("t5", "full_shard", 2, 4, "no", False), ("vit", "no_shard", 2, 4, "no", False),
                ("flava", "full_shard", 2, 2, "no", False), ("qwen3", "full_shard", 2, 4, "no", False),
                ("mistral", "shard_grad_op", 2, 4, "no", True), ("t5", "full_shard", 2, 2, "no", True, 1, 1024),
                ("mistral", "full_shard", 2, 2, "no", False, 1, 1024), ("t5", "full_shard", 2, 4, "fp16", False),
                ("bert", "ddp", 1, 4, "no", False), ("bert-28m", "ddp", 2, 4, "no", False),
                ("llama-wide", "full_shard", 2, 4, "no", True, 1, 256),
                ("llama", "full_shard", 2, 4, "no", False, 1, 64, "8:all-linear"),
                ("bert", "ddp", 2, 4, "no", False, 1, 64, "8"), ("gpt2", "full_shard", 2, 4, "no", False),
                ("llama", "full_shard", 2, 4, "no", False, 1, 64, "", "2"),
                ("gpt2", "full_shard", 2, 2, "bf16", True, 1, 1024, "", "2:sp"),
                ("qwen3", "full_shard", 4, 4, "no", False, 1, 64, "", "4"),
                ("llama", "full_shard", 3, 4, "no", False, 3, 64, "", "", "cpu"),
                ("t5", "full_shard", 2, 4, "bf16", True, 1, 64, "", "", "cpu"),
                ("t5", "shard_grad_op", 3, 2, "no", False, 1, 64, "", "", "cpu"),
                ("bert", "full_shard", 2, 2, "no", False, 1, 512, "", "", "activations"),
                ("gpt2", "ddp", 2, 2, "bf16", True, 1, 256, "", "", "activations")]
    cells = []
    for family, strategy, world in itertools.product(MODELS, STRATEGIES, [1, 2, 4]):
        if world == 1 and strategy in ("shard_grad_op", "no_shard"):
            continue  # at one rank every FSDP strategy is the same model (DDP is a runtime of its own)
        cells.append((family, strategy, world, 4, "no", False))
    for family, strategy in itertools.product(MODELS, ["full_shard", "shard_grad_op", "ddp"]):
        cells.append((family, strategy, 2, 4, "no", True))
        cells.append((family, strategy, 2, 4, "bf16", False))
        cells.append((family, strategy, 2, 4, "fp16", False))  # scaled loss, float32 reductions
    for family, batch in itertools.product(MODELS, [2, 8]):
        cells.append((family, "full_shard", 2, batch, "no", False))
    # Gradient accumulation over 3 micro-batches, untied (Llama) and tied tables (BERT, Qwen3, T5: the head's dense
    # gradient apart from .grad until the lookups' rows join it).
    for family, strategy in itertools.product(["bert", "llama", "qwen3", "t5"], ["full_shard", "ddp"]):
        cells.append((family, strategy, 2, 4, "no", False, 3))
    cells += long_cells()
    cells += lora_cells()
    # DDP's buckets two at a time, the last of them the embedding's (larger than the cap) plus what precedes it.
    cells += [("bert-28m", "ddp", 2, 4, "no", False), ("bert-28m", "ddp", 2, 4, "bf16", False),
              ("bert-28m", "full_shard", 2, 4, "no", False)]
    cells += [("llama-wide", strategy, 2, 4, "no", ac, 1, 256) for strategy in ("full_shard", "shard_grad_op")
              for ac in (False, True)]
    return cells


def long_cells():
    """Text at realistic lengths: attention over (T, T), masks made once, a layer's temporaries."""
    cells = []
    for family, tokens in [("bert", 512), ("llama", 1024), ("mistral", 1024), ("gpt2", 1024), ("t5", 1024)]:
        for strategy, precision, ac in [("full_shard", "no", False), ("full_shard", "no", True),
                                        ("ddp", "bf16", False)]:
            cells.append((family, strategy, 2, 2, precision, ac, 1, tokens))
    return cells


def lora_cells():
    """LoRA (model.lora): rank-8 adapters on the default targets (query and value), on every Linear of the layers,
    or on one projection; the rest frozen. What a frozen projection, norm and head no longer keep, an adapter keeps."""
    cells = []
    for family in MODELS:
        cells.append((family, "full_shard", 2, 4, "no", False, 1, 64, "8"))
        cells.append((family, "full_shard", 2, 4, "no", False, 1, 64, "8:all-linear"))
    for family, strategy, precision, ac in [("llama", "ddp", "no", False), ("llama", "full_shard", "bf16", False),
                                            ("llama", "full_shard", "no", True), ("bert", "ddp", "bf16", False),
                                            ("t5", "shard_grad_op", "no", True)]:
        cells.append((family, strategy, 2, 4, precision, ac, 1, 64, "8:all-linear"))
    for targets in ["o_proj", "gate_proj", "down_proj"]:
        cells.append(("llama", "full_shard", 2, 4, "no", False, 1, 256, "8:" + targets))
    cells.append(("llama", "full_shard", 2, 2, "no", False, 1, 1024, "8:all-linear"))
    return cells


def tp_cells():
    """Tensor parallelism (parallel.tp_size): every family, over 2 ranks alone and beside 2 data-parallel ranks of
    each strategy, with and without sequence parallelism (where the family's plan can be), checkpointing, bf16 and a
    realistic length; Qwen3's 2 key/value heads over 4 ranks (each held by two)."""
    long = {"llama": 1024, "qwen3": 1024, "mistral": 1024, "gpt2": 1024, "bert": 512, "t5": 1024}
    cells = []
    for family in ["llama", "qwen3", "mistral", "gpt2", "vit", "bert", "t5", "flava"]:
        sp = [":sp", ""] if family in ("llama", "qwen3", "mistral", "gpt2") else [""]
        lengths = [64] + ([long[family]] if family in long else [])
        for precision, ac, tokens, split in itertools.product(["no", "bf16"], [False, True], lengths, sp):
            batch = 2 if tokens > 64 or family == "flava" else 4
            cells.append((family, "full_shard", 2, batch, precision, ac, 1, tokens, "", "2" + split))
        for strategy in STRATEGIES:
            cells.append((family, strategy, 4, 2 if family == "flava" else 4, "no", False, 1, 64, "", "2" + sp[0]))
    cells.append(("qwen3", "full_shard", 4, 4, "no", False, 1, 64, "", "4"))
    cells.append(("qwen3", "full_shard", 4, 4, "no", True, 1, 64, "", "4:sp"))
    # LoRA's adapters split with their projections: on every Linear and on the default targets.
    for family in ["llama", "gpt2", "vit", "bert", "t5"]:
        cells.append((family, "full_shard", 2, 4, "no", False, 1, 64, "8:all-linear", "2"))
    cells.append(("llama", "full_shard", 2, 2, "bf16", True, 1, 1024, "8:all-linear", "2:sp"))
    cells.append(("gpt2", "full_shard", 2, 2, "no", False, 1, 1024, "8", "2:sp"))
    cells.append(("qwen3", "full_shard", 4, 4, "no", False, 1, 64, "8", "4"))
    cells.append(("llama", "full_shard", 4, 4, "no", True, 1, 64, "8:all-linear", "2:sp"))
    return cells


def offload_cells():
    """CPU offload (parallel.cpu_offload) of each FSDP strategy: the shards, their gradients and AdamW's state in host
    memory, each gather copying a unit's shards to the compute device and each reduction its gradients back; with
    checkpointing, bf16, accumulation and a realistic length. Activation offload (parallel.activation_offload): what
    each layer keeps in host memory from its forward to its backward, two layers' back at once; every family, with and
    without checkpointing, under FSDP and DDP in bf16, at realistic lengths, with LoRA, and beside CPU offload."""
    cells = []
    for family in ["bert", "llama", "t5", "vit", "flava"]:
        for strategy in ["full_shard", "shard_grad_op", "no_shard"]:
            cells.append((family, strategy, 2, 2 if family == "flava" else 4, "no", False, 1, 64, "", "", "cpu"))
        cells.append((family, "full_shard", 2, 4, "bf16", True, 1, 64, "", "", "cpu"))
    cells.append(("llama", "full_shard", 1, 4, "no", False, 1, 64, "", "", "cpu"))
    cells.append(("llama", "full_shard", 3, 4, "no", False, 3, 64, "", "", "cpu"))
    cells.append(("llama", "full_shard", 2, 2, "no", True, 1, 1024, "", "", "cpu"))
    cells.append(("llama", "full_shard", 2, 4, "no", False, 1, 64, "8:all-linear", "", "cpu"))
    for family in ["bert", "llama", "gpt2", "t5", "vit", "flava"]:
        batch = 2 if family == "flava" else 4
        for ac in (False, True):
            cells.append((family, "full_shard", 2, batch, "no", ac, 1, 64, "", "", "activations"))
        cells.append((family, "ddp", 2, batch, "bf16", False, 1, 64, "", "", "activations"))
    for family, tokens in [("llama", 1024), ("gpt2", 1024), ("t5", 1024), ("bert", 512)]:
        for ac in (False, True):
            cells.append((family, "full_shard", 2, 2, "no", ac, 1, tokens, "", "", "activations"))
    cells.append(("llama", "shard_grad_op", 2, 2, "bf16", True, 1, 1024, "", "", "activations"))
    cells.append(("llama", "full_shard", 2, 4, "no", False, 1, 256, "8:all-linear", "", "activations"))
    cells.append(("llama", "full_shard", 2, 2, "bf16", True, 1, 1024, "", "", "cpu+activations"))
    cells.append(("t5", "full_shard", 2, 4, "no", False, 1, 256, "", "", "cpu+activations"))
    for family, strategy in [("llama", "full_shard"), ("t5", "shard_grad_op"), ("flava", "full_shard")]:
        cells.append((family, strategy, 2, 2 if family == "flava" else 4, "no", False, 1, 64, "", "", "nvme"))
    return cells


def options(cell):
    """(micro-batches, tokens, LoRA "rank[:targets]" or "") of a cell."""
    return (cell[6] if len(cell) > 6 else 1), (cell[7] if len(cell) > 7 else 64), (cell[8] if len(cell) > 8 else "")


def tp_of(cell):
    """A cell's tensor-parallel size and whether it is sequence parallel: (1, False) without."""
    text = cell[9] if len(cell) > 9 else ""
    if not text:
        return 1, False
    size, _, sp = text.partition(":")
    return int(size), sp == "sp"


def run_cell(build, config_dir, cell):
    family, strategy, world, batch, precision, ac = cell[:6]
    grad_accum, tokens, lora = options(cell)
    cmd = [os.path.join(build, "shardtrain"), "launch", "--nproc-per-node", str(world), "--",
           os.path.join(build, "memory_model_bench"), "--model", os.path.join(config_dir, family), "--strategy",
           strategy, "--batch", str(batch), "--seq-len", str(tokens), "--mixed-precision", precision]
    if ac:
        cmd.append("--ac")
    if grad_accum > 1:
        cmd += ["--grad-accum", str(grad_accum)]
    if lora:
        rank, _, targets = lora.partition(":")
        cmd += ["--lora", rank] + (["--lora-targets", targets] if targets else [])
    tp, sp = tp_of(cell)
    if tp > 1:
        cmd += ["--tp", str(tp)] + (["--sp"] if sp else [])
    if "cpu" in cell.offload:
        cmd.append("--offload")
    if "nvme" in cell.offload:  # the disk tier: AdamW's state in a scratch file beside the configs
        os.makedirs(os.path.join(config_dir, "nvme"), exist_ok=True)
        cmd += ["--nvme", os.path.join(config_dir, "nvme")]
    if "activations" in cell.offload:
        cmd.append("--activation-offload")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    for line in out.stdout.splitlines() + out.stderr.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"{cell}: no result (exit {out.returncode}):\n{out.stderr[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--tp", action="store_true")
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--only", default=None)
    parser.add_argument("--check", default=None)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--build", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"))
    args = parser.parse_args()

    cells = lora_cells() if args.lora else tp_cells() if args.tp else offload_cells() if args.offload \
        else grid(args.quick)
    cells = [Cell(*cell) for cell in cells]
    if args.only:
        words = args.only.replace(",", " ").split()
        cells = [c for c in cells if [str(x) for x in c[:len(words)]] == words]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family, config in {**MODELS, **LARGER_MODELS}.items():
            os.makedirs(os.path.join(tmp, family))
            with open(os.path.join(tmp, family, "config.json"), "w") as f:
                json.dump(config, f)
        print(f"{len(cells)} cells; MB = 10^6 bytes, measured / predicted, error = predicted / measured - 1",
              flush=True)
        print(f"{'model':6s} {'strategy':14s} {'W':>2s} {'B':>4s} {'T':>4s} {'prec':4s} {'AC':2s} {'params':>9s} "
              + " ".join(f"{p + ' MB':>19s}" for p in PHASES) + f" {'peak err':>9s}"
              + (f" {'host MB (offloaded)':>19s}" if any(c.offload for c in cells) else ""), flush=True)
        start = time.time()
        for i, cell in enumerate(cells):
            r = run_cell(args.build, tmp, cell)
            measured, predicted = r["measured"], r["predicted"]
            if cell.offload:  # the host tier as a fourth phase
                measured, predicted = measured + r["host"][:1], predicted + r["host"][1:]
            errors = phase_errors(measured, predicted)
            peak_error = max(predicted[:3]) / max(measured[:3]) - 1  # the compute tier's
            rows.append((cell, r, errors, peak_error))
            family, strategy, world, batch, precision, ac = cell[:6]
            grad_accum, tokens, lora = options(cell)
            accum = f"x{grad_accum}" if grad_accum > 1 else ""
            print(f"{family:6s} {strategy:14s} {world:2d} {str(batch) + accum:>4s} {tokens:4d} {precision:4s} "
                  f"{'on' if ac else '':2s} "
                  f"{r['parameters'] / 1e6:8.1f}M "
                  + " ".join(f"{m / 1e6:7.1f}/{p / 1e6:7.1f}{e * 100:+4.0f}%".rjust(19)
                             for m, p, e in zip(measured, predicted, errors))
                  + f" {peak_error * 100:+8.1f}%" + (f"  LoRA {lora}" if lora else "")
                  + (f"  TP {cell[9]}" if tp_of(cell)[0] > 1 else "") + (f"  offload {cell.offload}" if cell.offload else "")
                  + f"   [{i + 1}/{len(cells)}, {time.time() - start:.0f} s]", flush=True)

    worst = max(rows, key=lambda row: abs(row[3]))
    worst_phase = max(rows, key=lambda row: max(abs(e) for e in row[2]))
    within = sum(1 for row in rows if abs(row[3]) <= 0.10)
    print(f"peak within 10%: {within} of {len(rows)} cells; largest peak error {worst[3] * 100:+.1f}% {worst[0]}; "
          f"largest phase error {max(abs(e) for e in worst_phase[2]) * 100:.1f}% {worst_phase[0]}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("model,strategy,world,batch,precision,ac,grad_accum,tokens,lora," + ("tp," if args.tp else "") +
                    ("offload," if args.offload else "") +
                    ",".join(f"{p}_measured,{p}_predicted" for p in PHASES) +
                    (",host_measured,host_predicted" if args.offload else "") + "\n")
            for cell, r, _, _ in rows:
                f.write(",".join(str(c) for c in cell[:6]) + ",{},{},{},".format(*options(cell)) +
                        (f"{cell[9]}," if args.tp else "") + (f"{cell.offload}," if args.offload else "") +
                        ",".join(f"{m:.0f},{p:.0f}" for m, p in zip(r["measured"], r["predicted"])) +
                        (",{:.0f},{:.0f}".format(*r["host"]) if args.offload else "") + "\n")
    if args.check is not None:
        under, over = bounds(args.check)
        failures = [(row[0], phase, error) for row in rows for phase, error in zip(PHASES + ["host"], row[2])
                    if error < -under or error > over]
        for cell, phase, error in failures:
            print(f"FAIL: {cell} {phase}: predicted {error * 100:+.1f}% from measured (bound -{under * 100:.0f}% / "
                  f"+{over * 100:.0f}%)")
        if failures:
            return 1
        print(f"every phase of every cell within -{under * 100:.0f}% / +{over * 100:.0f}% of measured")
    return 0


def phase_errors(measured, predicted):
    """Each phase's prediction over its measurement, minus 1; a phase that holds almost nothing (under 2% of the
    cell's compute peak: offloaded, the device during the optimizer step) is judged against that peak instead, as a
    few hundred kilobytes more or less there decide nothing about what fits."""
    peak = max(measured[:3])
    return [p / m - 1 if m >= 0.02 * peak else (p - m) / peak for m, p in zip(measured, predicted)]


def bounds(text):
    """--check's (under, over) fractions: 'UNDER:OVER', or one value for both."""
    parts = text.split(":")
    if len(parts) == 1:
        return float(parts[0]), float(parts[0])
    if len(parts) == 2:
        return float(parts[0]), float(parts[1])
    raise SystemExit(f"--check {text}: expected UNDER:OVER (0.03:0.08) or one tolerance (0.10)")


if __name__ == "__main__":
    sys.exit(main())
