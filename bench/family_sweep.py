"""Every text family against transformers (and PyTorch's FSDP2) over shapes drawn from ranges, not one configuration
each: one model per family at the shapes users train hides what another shape shows (a vocabulary small against the
width, grouped-query attention, long sequences, a batch of one).

For each family, CONFIGS configurations drawn with a fixed seed (printed): vocabulary from 2k to 128k, width 128 to
768, 2 to 4 layers, sequence 128 to 2048 (T5's rows span-corrupted as the trainer's: its encoder and decoder
lengths the memory model's for that length), Llama's key/value heads 1 to all, local
batch 1 to 16 — the logits (B x T x V float32) under 256 MB and the vocabulary's table under 16M elements, so that a
cell runs in seconds here. Each runs:
- world size 1, with and without activation checkpointing of every layer, ours against transformers' model;
- 2 ranks under FULL_SHARD, with and without activation checkpointing of every layer, ours against FSDP2 on
  transformers' model (non-reentrant checkpointing);
each on both of our call paths (bench/family_bench.cpp --logits): the loss alone (the trainer's) and the logits
with the loss from them (transformers' forward(labels=...)). Memory is the peak of the largest rank over the timed
steps, counted by shardtrain's allocator on both sides; the memory model (`shardtrain estimate-memory ... --json`)
predicts the loss-alone path's forward and backward peaks (the trainer's step adds clipping, which the benchmark's
does not run). Prints every cell, then the worst per family (largest memory ratio; largest model error).

    .venv/bin/python bench/family_sweep.py [--build build] [--families llama,gpt2,bert,t5] [--configs 3] [--seed 61]
                                           [--steps 2] [--warmup 1] [--shape FAMILY:V,L,C,T,B[,KV] ...]

--shape runs the configurations given (vocabulary, layers, width, tokens, local batch, Llama's key/value heads)
instead of drawing them: a shape the draws at a seed missed.

Goals (issue 61): memory <= 1.00x transformers' in every cell; the memory model within 10% of every cell.
Time ratios are printed but mean little here: the two ranks share two cores with the other side's runs idle.
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file
import transformers

import bench_common

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

LOGITS_CAP = 256e6  # bytes of float32 (B, T, V) logits a cell may hold
TABLE_CAP = 16e6    # elements of the vocabulary's table (64 MB in float32, its gradient and AdamW's state 3x that)


def t5_lengths(tokens):
    """(encoder, decoder) lengths of span corruption over rows of `tokens` (models::span_corruption_lengths: 15%
    of the text in spans of 3, a sentinel per span and the end): the memory model's T5 job at that length."""
    n = max(tokens - 2, 1)
    masked = max(1, math.floor(0.15 * n + 0.5)) if n > 1 else 0
    spans = max(1 if masked > 0 else 0, math.floor(masked / 3 + 0.5))
    return n - masked + spans + 1, masked + spans + 1


def draw(rng, family):
    """One configuration: (transformers config, local batch, tokens, description)."""
    while True:
        vocab = rng.choice([2048, 4096, 8192, 16384, 32000, 50257, 65536, 128256])
        width = rng.choice([128, 256, 384, 512, 768])
        layers = rng.choice([2, 3, 4])
        tokens = rng.choice([128, 256, 512, 1024, 2048])
        batch = rng.choice([1, 2, 4, 8, 16])
        target = t5_lengths(tokens)[1] if family == "t5" else tokens
        if batch * target * vocab * 4 <= LOGITS_CAP and vocab * width <= TABLE_CAP:
            break
    heads = width // 64
    kv = rng.choice([h for h in (1, 2, 4, heads) if heads % h == 0]) if family == "llama" else 0
    return configured(family, vocab, layers, width, tokens, batch, kv)


def configured(family, vocab, layers, width, tokens, batch, kv=0):
    """The configuration of those numbers: (transformers config, local batch, tokens, description); kv: Llama's
    key/value heads (0: all)."""
    heads = width // 64
    if family == "llama":
        kv = kv or heads
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=width * 8 // 3,
                                          num_hidden_layers=layers, num_attention_heads=heads,
                                          num_key_value_heads=kv, max_position_embeddings=2048,
                                          tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
        what = f"{kv} kv heads of {heads}"
    elif family == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=width, n_layer=layers, n_head=heads,
                                         n_positions=2048, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         architectures=["GPT2LMHeadModel"])
        what = "tied head"
    elif family == "bert":
        config = transformers.BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers,
                                         num_attention_heads=heads, intermediate_size=4 * width,
                                         max_position_embeddings=2048, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0, architectures=["BertForMaskedLM"])
        what = "15% masked"
    else:
        config = transformers.T5Config(vocab_size=vocab, d_model=width, d_kv=64, d_ff=4 * width, num_layers=layers,
                                       num_heads=heads, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                                       eos_token_id=1, architectures=["T5ForConditionalGeneration"])
        what = "encoder {}, decoder {}".format(*t5_lengths(tokens))
    return config, batch, tokens, f"V {vocab}, {layers} x {width}, T {tokens}, B {batch}, {what}"


def global_batch(family, config, rows, tokens, g):
    vocab = config.vocab_size
    ids = torch.randint(5, vocab, (rows, tokens), generator=g)
    mask = torch.ones_like(ids)
    if family == "bert":
        labels = torch.full_like(ids, -100)
        chosen = torch.rand(ids.shape, generator=g) < 0.15
        labels[chosen] = ids[chosen]
        return dict(input_ids_masked=ids.masked_fill(chosen, 103), attention_mask=mask, mlm_labels=labels)
    if family == "t5":
        encoder, decoder = t5_lengths(tokens)
        return dict(input_ids=ids[:, :encoder].contiguous(), attention_mask=mask[:, :encoder].contiguous(),
                    labels=torch.randint(5, vocab, (rows, decoder), generator=g))
    return dict(input_ids=ids, attention_mask=mask, labels=ids.clone())


def predicted(build, model_dir, world, batch, tokens, checkpoint):
    """The memory model's (forward, backward) peaks of the trainer's loss path, bytes per rank."""
    strategy = "full_shard" if world > 1 else "ddp"  # one rank: the model as it is
    cmd = [os.path.join(build, "shardtrain"), "estimate-memory", model_dir, "--num-processes", str(world),
           "--strategy", strategy, "--batch-size", str(batch), "--seq-len", str(tokens), "--device", "cpu",
           "--json"] + (["--activation-checkpointing"] if checkpoint else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    phases = json.loads(out.stdout)["phases"]
    return phases["forward"], phases["backward"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--families", default="llama,gpt2,bert,t5")
    p.add_argument("--configs", type=int, default=3)
    p.add_argument("--seed", type=int, default=61)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--shape", action="append", default=[],
                   help="FAMILY:V,L,C,T,B[,KV] (vocabulary, layers, width, tokens, local batch, Llama's key/value "
                        "heads): run this configuration instead of drawing (repeatable)")
    a = p.parse_args()
    launcher, ours = os.path.join(a.build, "shardtrain"), os.path.join(a.build, "family_bench")
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(a.seed)
    if a.shape:
        jobs = [(family, n, configured(family, *[int(x) for x in numbers.split(",")]))
                for n, (family, numbers) in enumerate(shape.split(":") for shape in a.shape)]
        print(f"{len(jobs)} configurations given", flush=True)
    else:
        jobs = [(family, n, draw(rng, family)) for family in a.families.split(",") for n in range(a.configs)]
        print(f"seed {a.seed}, {a.configs} configurations per family", flush=True)
    rows = []  # (family, description, case, call, ours, theirs, model error or None)
    with tempfile.TemporaryDirectory(prefix="shardtrain-family-sweep-") as tmp:
        for family, n, (config, batch, tokens, what) in jobs:
            torch.manual_seed(a.seed + n)
            model = getattr(transformers, config.architectures[0])(config)
            d = os.path.join(tmp, f"{family}-{n}")
            model.save_pretrained(d, safe_serialization=True)
            del model
            g = torch.Generator().manual_seed(a.seed + n)
            data = global_batch(family, config, 2 * batch, tokens, g)
            batch_file = os.path.join(d, "batch.safetensors")
            save_file({k: v.contiguous() for k, v in data.items()}, batch_file)
            common = ["--model", d, "--batch", batch_file, "--steps", str(a.steps), "--warmup", str(a.warmup)]
            for world, mode, checkpoint in [(1, "plain", False), (1, "plain", True), (2, "full_shard", False),
                                            (2, "full_shard", True)]:
                # The world-size-1 runs take the first half of the global batch: its rows are the local batch.
                files = common if world == 2 else common[:3] + [half_batch(batch_file, batch)] + common[4:]
                extra = ["--mode", mode] + (["--checkpoint"] if checkpoint else [])
                launch = [launcher, "launch", "--nproc-per-node", str(world), "--"]
                theirs = bench_common.run_result(launch + [sys.executable, os.path.join(here, "hf_family_step.py"),
                                                           "--memhook", memhook] + files + extra)
                case = f"W={world} {mode}{' +AC' if checkpoint else ''}"
                for call in ("loss", "logits"):
                    o = bench_common.run_result(launch + [ours] + files + extra +
                                                (["--logits"] if call == "logits" else []))
                    error = None
                    if call == "loss":
                        forward, backward = predicted(a.build, d, world, batch, tokens, checkpoint)
                        measured = max(o["phase_peak_bytes"][:2])
                        error = max(forward, backward) / measured - 1
                    rows.append((family, what, case, call, o, theirs, error))
                    r = rows[-1]
                    print(line(r), flush=True)
    print("\nworst cell per family (memory ratio; memory model error on the loss path):")
    for family in dict.fromkeys(job[0] for job in jobs):
        mine = [r for r in rows if r[0] == family]
        worst = max(mine, key=lambda r: r[4]["peak_bytes"] / r[5]["peak_bytes"])
        print("  memory " + line(worst))
        modelled = [r for r in mine if r[6] is not None]
        worst_model = max(modelled, key=lambda r: abs(r[6]))
        print("  model  " + line(worst_model))
    over = [r for r in rows if r[4]["peak_bytes"] > r[5]["peak_bytes"]]
    off = [r for r in rows if r[6] is not None and abs(r[6]) > 0.10]
    print(f"\n{len(rows)} cells: {len(over)} above transformers' peak, {len(off)} with the memory model off by more "
          f"than 10%")


def half_batch(path, rows):
    """The first `rows` rows of the global batch in `path`, as a file of their own beside it."""
    from safetensors.torch import load_file
    out = path.replace(".safetensors", f"-{rows}.safetensors")
    if not os.path.exists(out):
        save_file({k: v[:rows].contiguous() for k, v in load_file(path).items()}, out)
    return out


def line(r):
    family, what, case, call, o, t, error = r
    model = f"  model {error * 100:+5.1f}%" if error is not None else ""
    return (f"{family:6s} {what:48s} {case:18s} {call:6s} ours {o['peak_bytes'] / 2**20:8.1f} MiB / "
            f"theirs {t['peak_bytes'] / 2**20:8.1f} = {o['peak_bytes'] / t['peak_bytes']:5.2f}x  "
            f"time {o['step_ms'] / t['step_ms']:5.2f}x{model}")


if __name__ == "__main__":
    main()
