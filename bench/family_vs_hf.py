"""Every model family of the zoo against Hugging Face transformers on the same training step, in one run: a model
of a few tens of millions of parameters per family (transformers builds it with random weights and saves it as a
model directory; shardtrain builds its own from that directory's config.json and weights), one batch at a
realistic sequence length (FLAVA: one of each kind it pretrains on, image-text, text only, image only), the
model's own loss, backward and fused AdamW, both sides launched alike through `shardtrain launch` and their
memory counted by shardtrain's allocator (bench/family_bench.cpp,
bench/hf_family_step.py). Prints median step time, peak CPU memory of the largest rank, their ratios (ours over
theirs), and how far the losses are apart (the first step's is the same computation on the same weights).

    .venv/bin/python bench/family_vs_hf.py [--build build] [--families bert,vit,t5,llama,gpt2,flava] [--worlds 1,2]
                                           [--steps 6] [--warmup 2] [--repeats 1] [--calls loss,logits]

--calls: how ours is called, the text families' two paths: `loss` the loss alone (the head fused with the
cross-entropy in chunks, what the trainer runs), `logits` the logits and the loss from them (as transformers'
forward(labels=...) computes, what a user calling the model with labels gets). transformers' always computes the
logits; the outputs are dropped on both sides, as `model(...).loss` drops them.

World size 1 compares the models themselves (no sharding on either side); W > 1 compares FULL_SHARD,
SHARD_GRAD_OP and FULL_SHARD with activation checkpointing of every layer against PyTorch's FSDP2 (fully_shard per
layer and root; transformers' gradient checkpointing, non-reentrant) on transformers' model. The ranks of W > 1
share this machine's cores: compare rows of one world size, not across.

--repeats R runs each case R times, ours and theirs alternating, and keeps each side's fastest median step (on a
shared two-core machine interference only ever adds time, and one run's median still moves by 10-20%); memory
and losses are the same every time (the fastest run's are printed).
"""
import argparse
import itertools
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file
import transformers

import bench_common

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

BATCH = 8  # rows of the global batch: W = 1, 2, 4 all divide it
TEXT_FAMILIES = ("bert", "t5", "llama", "gpt2")  # those whose loss can be taken from logits (--calls logits)


def models_and_batches():
    """Per family: (transformers model, [(name, batch under data::Batch's names, what it is)]): one batch, and for
    FLAVA one of each kind it pretrains on (image-text, text, image). Dropout off on both sides, so that the first
    step is the same computation."""
    g = torch.Generator().manual_seed(0)
    out = {}

    def text(vocab, length):
        ids = torch.randint(5, vocab, (BATCH, length), generator=g)
        mask = torch.ones(BATCH, length, dtype=torch.long)
        mask[1, length * 3 // 4:] = 0  # one padded row
        return ids, mask

    bert = transformers.BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   architectures=["BertForMaskedLM"])
    ids, mask = text(bert.vocab_size, 128)
    masked = ids.clone()
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape, generator=g) < 0.15
    labels[chosen], masked[chosen] = ids[chosen], 103
    out["bert"] = (transformers.BertForMaskedLM(bert), [("bert", dict(input_ids_masked=masked, attention_mask=mask,
                                                                      mlm_labels=labels), "6 x 512, seq 128")])

    vit = transformers.ViTConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048,
                                 num_labels=1000, architectures=["ViTForImageClassification"])
    out["vit"] = (transformers.ViTForImageClassification(vit),
                  [("vit", dict(pixels=torch.randn(BATCH, 3, 224, 224, generator=g),
                                labels=torch.randint(0, 1000, (BATCH,), generator=g)),
                    "6 x 512, 224 px / 16 (197 tokens)")])

    t5 = transformers.T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8, feed_forward_proj="relu",
                               dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                               architectures=["T5ForConditionalGeneration"])
    ids, mask = text(t5.vocab_size, 128)
    target = torch.randint(5, t5.vocab_size, (BATCH, 32), generator=g)
    target[2, 24:] = -100
    out["t5"] = (transformers.T5ForConditionalGeneration(t5),
                 [("t5", dict(input_ids=ids, attention_mask=mask, labels=target), "4+4 x 512, seq 128 -> 32")])

    llama = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                                     num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                                     tie_word_embeddings=False, architectures=["LlamaForCausalLM"])
    ids, mask = text(llama.vocab_size, 256)
    out["llama"] = (transformers.LlamaForCausalLM(llama),
                    [("llama", dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)),
                      "6 x 512, seq 256")])

    # GPT-2 at gpt2's shape but 6 layers (distilgpt2's), dropout off.
    gpt2 = transformers.GPT2Config(n_layer=6, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   architectures=["GPT2LMHeadModel"])
    ids, mask = text(gpt2.vocab_size, 256)
    out["gpt2"] = (transformers.GPT2LMHeadModel(gpt2),
                   [("gpt2", dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)),
                     "6 x 768, seq 256")])

    common = dict(hidden_size=384, intermediate_size=1536, num_attention_heads=6)
    flava = transformers.FlavaConfig(
        image_config=dict(common, num_hidden_layers=4), text_config=dict(common, num_hidden_layers=4),
        multimodal_config=dict(common, num_hidden_layers=2), hidden_size=384, projection_dim=384,
        architectures=["FlavaForPreTraining"])
    ids, mask = text(30522, 64)
    masked = ids.clone()
    mlm = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape, generator=g) < 0.15
    mlm[chosen], masked[chosen] = ids[chosen], 103
    patches = torch.rand(BATCH, 196, generator=g) < 0.4
    text_part = dict(input_ids=ids, input_ids_masked=masked, attention_mask=mask, mlm_labels=mlm)
    image_part = dict(pixels=torch.randn(BATCH, 3, 224, 224, generator=g),
                      codebook_pixels=torch.rand(BATCH, 3, 112, 112, generator=g), masked_patches=patches)
    out["flava"] = (transformers.FlavaForPreTraining(flava),
                    [("flava", dict(text_part, **image_part, itm_labels=torch.tensor([1, 0] * (BATCH // 2))),
                      "4+4+2 x 384, image-text, text 64, 224 px"),
                     ("flava text", text_part, "4+4+2 x 384, text only (MLM), 64"),
                     ("flava image", image_part, "4+4+2 x 384, image only (MIM), 224 px")])
    return out


def fastest(best, result):
    """The result with the smaller median step of two (best may be None)."""
    return result if best is None or result["step_ms"] < best["step_ms"] else best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--families", default="bert,vit,t5,llama,gpt2,flava")
    p.add_argument("--worlds", default="1")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="alternating runs per side; the fastest is kept")
    p.add_argument("--calls", default="loss", help="loss, logits or both (comma-separated): how ours is called")
    a = p.parse_args()
    launcher, ours = os.path.join(a.build, "shardtrain"), os.path.join(a.build, "family_bench")
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    families = a.families.split(",")
    worlds = [int(w) for w in a.worlds.split(",")]
    made = models_and_batches()
    rows = []
    measured = {}  # transformers' result by (batch, world, mode, checkpoint): the same whichever way ours is called
    with tempfile.TemporaryDirectory(prefix="shardtrain-family-bench-") as tmp:
        for family in families:
            model, batches = made[family]
            torch.manual_seed(1)
            with torch.no_grad():  # transformers zero-initialises biases: random values are a fairer test
                for prm in model.parameters():
                    prm.add_(torch.randn_like(prm) * 0.02)
            d = os.path.join(tmp, family)
            model.save_pretrained(d, safe_serialization=True)
            params = sum(prm.numel() for prm in model.parameters())
            for name, batch, what in batches:
                batch_file = os.path.join(d, name.replace(" ", "-") + ".safetensors")
                save_file({k: v.contiguous() for k, v in batch.items()}, batch_file)
                common = ["--model", d, "--batch", batch_file, "--steps", str(a.steps), "--warmup", str(a.warmup)]
                for world in worlds:
                    cases = [("plain", False)] if world == 1 else [("full_shard", False), ("shard_grad_op", False),
                                                                    ("full_shard", True)]
                    calls = a.calls.split(",") if family in TEXT_FAMILIES else ["loss"]
                    for (mode, checkpoint), call in itertools.product(cases, calls):
                        extra = ["--mode", mode] + (["--checkpoint"] if checkpoint else []) + \
                            (["--logits"] if call == "logits" else [])
                        label = (f"{name} W={world} {mode}{' +AC' if checkpoint else ''}"
                                 f"{' logits' if call == 'logits' else ''}")
                        print(f"  running {label}", file=sys.stderr, flush=True)
                        launch = [launcher, "launch", "--nproc-per-node", str(world), "--"]
                        theirs = [sys.executable, os.path.join(here, "hf_family_step.py"), "--memhook", memhook]
                        o, t = None, measured.get((name, world, mode, checkpoint))  # theirs: one per case
                        for _ in range(max(1, a.repeats)):
                            o = fastest(o, bench_common.run_result(launch + [ours] + common + extra))
                            if (name, world, mode, checkpoint) not in measured:
                                t = fastest(t, bench_common.run_result(launch + theirs + common + extra))
                        measured[(name, world, mode, checkpoint)] = t
                        rows.append((label, what, params, o, t))

    runs = f", fastest of {a.repeats} runs" if a.repeats > 1 else ""
    print(f"\nshardtrain vs transformers{' (+ FSDP2 at W > 1)' if max(worlds) > 1 else ''}: global batch {BATCH}, "
          f"{a.steps} timed steps (median of the slowest rank{runs}), peak = most CPU bytes live on any rank during "
          f"them; ratios ours / theirs\n")
    print(f"{'run':32s} {'params':>7s} {'ours ms':>9s} {'hf ms':>9s} {'time':>6s} {'ours MB':>8s} {'hf MB':>8s} "
          f"{'mem':>6s} {'loss 1 diff':>11s} {'last diff':>9s}   model")
    for label, what, params, o, t in rows:
        first = abs(o["losses"][0] - t["losses"][0]) / abs(t["losses"][0])
        last = abs(o["losses"][-1] - t["losses"][-1]) / abs(t["losses"][-1])
        print(f"{label:32s} {params / 1e6:6.1f}M {o['step_ms']:9.1f} {t['step_ms']:9.1f} "
              f"{o['step_ms'] / t['step_ms']:5.2f}x {o['peak_bytes'] / 2**20:8.1f} {t['peak_bytes'] / 2**20:8.1f} "
              f"{o['peak_bytes'] / t['peak_bytes']:5.2f}x {first:11.1e} {last:9.1e}   {what}")
    print("\npeak MB by phase (forward with the loss, backward, optimizer step), ours / theirs:")
    for label, what, params, o, t in rows:
        phases = "  ".join(f"{x / 2**20:7.1f} / {y / 2**20:7.1f}" for x, y in zip(o["phase_peak_bytes"],
                                                                              t["phase_peak_bytes"]))
        print(f"{label:32s} {phases}")
    print("\nmedian ms by phase (forward with the loss, backward, optimizer step), ours / theirs:")
    for label, what, params, o, t in rows:
        phases = "  ".join(f"{x:7.1f} / {y:7.1f}" for x, y in zip(o["phase_ms"], t["phase_ms"]))
        print(f"{label:32s} {phases}")


if __name__ == "__main__":
    main()
