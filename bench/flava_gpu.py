"""The PyTorch reference for docs/notes/gpu.md: transformers' FlavaForPreTraining trained on one GPU in bf16
autocast (float32 parameters and AdamW, as shardtrain's `parallel.mixed_precision: bf16`), on random image-text
batches shaped as shardtrain's: 224 px images in 16 px patches, 112 px codebook images, 40% of patches masked,
text padded to --seq-len with 15% of tokens masked, half the pairs mismatched for ITM. Every loss of FLAVA's
pretraining (contrastive, ITM, MMM text and image, MLM, MIM) as one step of shardtrain's image-text batches.

    python3 bench/flava_gpu.py --flavor flava-350m --batch 32 [--steps 20] [--checkpoint] [--max-batch]

Prints items/s, the step time and the CUDA caching allocator's peak; --max-batch doubles the batch from --batch
until it runs out of memory, then bisects, and prints the largest that trains a step.
"""
import argparse
import time

import torch
from transformers import FlavaConfig, FlavaForPreTraining
import transformers

transformers.logging.set_verbosity_error()

# The FLAVA post's table (shardtrain's zoo flavors): hidden, MLP, heads, unimodal layers, multimodal layers.
FLAVORS = {
    "flava-350m": (768, 3072, 12, 12, 6),
    "flava-900m": (1024, 4096, 16, 24, 12),
    "flava-1.8b": (1280, 5120, 16, 32, 16),
    "flava-2.7b": (1408, 6144, 16, 40, 20),
    "flava-4.8b": (1664, 8192, 16, 48, 24),
    "flava-10b": (2048, 10240, 16, 64, 40),
}


def flava_config(name):
    dim, mlp, heads, unimodal, multimodal = FLAVORS[name]
    common = dict(hidden_size=dim, intermediate_size=mlp, num_attention_heads=heads)
    return FlavaConfig(image_config=dict(common, num_hidden_layers=unimodal),
                       text_config=dict(common, num_hidden_layers=unimodal),
                       multimodal_config=dict(common, num_hidden_layers=multimodal),
                       hidden_size=dim, projection_dim=dim)


def make_batch(b, seq_len, device, g):
    ids = torch.randint(1000, 30000, (b, seq_len), generator=g)
    ids[:, 0] = 101
    masked = ids.clone()
    mlm_labels = torch.full_like(ids, -100)
    pick = torch.rand(b, seq_len, generator=g) < 0.15
    pick[:, 0] = False
    pick[:, 1] = True
    mlm_labels[pick] = ids[pick]
    masked[pick] = 103
    patches = torch.rand(b, 196, generator=g) < 0.4
    patches[:, 0] = True
    batch = dict(input_ids=ids, input_ids_masked=masked, attention_mask=torch.ones_like(ids),
                 pixel_values=torch.randn(b, 3, 224, 224, generator=g),
                 codebook_pixel_values=torch.rand(b, 3, 112, 112, generator=g), bool_masked_pos=patches,
                 mlm_labels=mlm_labels, itm_labels=(torch.rand(b, generator=g) < 0.5).long())
    return {k: v.to(device) for k, v in batch.items()}


def train(name, b, steps, seq_len, checkpoint, warmup=3):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = FlavaForPreTraining(flava_config(name)).to(device)
    if checkpoint:
        model.gradient_checkpointing_enable()  # every encoder layer recomputed in backward
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batches = [make_batch(b, seq_len, device, g) for _ in range(2)]
    torch.cuda.reset_peak_memory_stats()
    start = None
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batches[step % 2], return_loss=True).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    params = sum(p.numel() for p in model.parameters())
    peak = torch.cuda.max_memory_allocated() / 2**30
    del model, opt, batches
    torch.cuda.empty_cache()
    return params, seconds, peak


def fits(name, b, seq_len, checkpoint):
    try:
        train(name, b, 1, seq_len, checkpoint, warmup=1)
        return True
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="flava-350m", choices=sorted(FLAVORS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=77)
    p.add_argument("--checkpoint", action="store_true", help="transformers' gradient checkpointing")
    p.add_argument("--max-batch", action="store_true")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if a.max_batch:
        lo, hi = 0, a.batch
        while fits(a.flavor, hi, a.seq_len, a.checkpoint):
            lo, hi = hi, hi * 2
        while hi - lo > max(1, lo // 16):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(a.flavor, mid, a.seq_len, a.checkpoint) else (lo, mid)
        print(f"hf {a.flavor} checkpoint={a.checkpoint}: largest batch that trains {lo} (to within {hi - lo})",
              flush=True)
        return
    params, seconds, peak = train(a.flavor, a.batch, a.steps, a.seq_len, a.checkpoint)
    print(f"hf {a.flavor} ({params / 1e6:.0f}M parameters) batch {a.batch} checkpoint={a.checkpoint}: "
          f"{seconds * 1e3:.1f} ms a step, {a.batch / seconds:.1f} items/s, peak {peak:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
