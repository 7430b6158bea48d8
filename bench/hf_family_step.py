"""transformers' side of bench/family_vs_hf.py: the Hugging Face model of a model directory (from_pretrained, the
class its config.json names, transformers' default attention), trained on the recorded batch exactly as
bench/family_bench.cpp trains shardtrain's: the model's own loss, backward, AdamW (fused), for N steps; with
PyTorch's FSDP2 (fully_shard on every transformer layer, then the root) and, with --checkpoint, transformers'
gradient checkpointing (non-reentrant) of every layer. Run under `shardtrain launch`; memory is counted by
shardtrain's counting allocator loaded from libshardtrain_memhook.so, as on our side. Prints one RESULT line.
"""
import argparse
import json
import os

import bench_common


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", required=True)
    p.add_argument("--mode", default="plain", choices=["plain", "full_shard", "shard_grad_op"])
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--logits", action="store_true",
                   help="accepted for family_bench's: transformers computes the logits with the loss")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--memhook", required=True)
    p.add_argument("--profile", help="one more step under torch.profiler, its Chrome trace written here "
                   "(FILE.rank<r> when W > 1)")
    return p.parse_args()


LAYER_CLASSES = {"BertLayer", "ViTLayer", "T5Block", "LlamaDecoderLayer", "GPT2Block", "FlavaLayer"}


def layers_of(model):
    """The transformer layers FSDP2 users shard one by one (what shardtrain's units are), found by class."""
    layers = [m for m in model.modules() if type(m).__name__ in LAYER_CLASSES]
    if not layers:
        raise SystemExit(f"no transformer layer ({sorted(LAYER_CLASSES)}) in {type(model).__name__}")
    return layers


def loss_of(family, model, b):
    if family == "bert":
        return model(input_ids=b["input_ids_masked"], attention_mask=b["attention_mask"], labels=b["mlm_labels"]).loss
    if family == "vit":
        return model(pixel_values=b["pixels"], labels=b["labels"]).loss
    if family in ("t5", "llama", "gpt2"):
        return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
    if family == "flava":
        return model(input_ids=b.get("input_ids"), input_ids_masked=b.get("input_ids_masked"),
                     attention_mask=b.get("attention_mask"), pixel_values=b.get("pixels"),
                     codebook_pixel_values=b.get("codebook_pixels"), bool_masked_pos=b.get("masked_patches"),
                     mlm_labels=b.get("mlm_labels"), itm_labels=b.get("itm_labels"), return_loss=True).loss
    raise SystemExit(f"no loss for {family}")


def main():
    args = parse()
    hook = bench_common.load_memhook(args.memhook)
    import torch  # after the library: the counter is installed before any tensor exists
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    hook.shardtrain_install_cpu_memory_counter()

    rank, world = bench_common.init_gloo()

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    family = config["model_type"]
    model = getattr(transformers, config["architectures"][0]).from_pretrained(args.model).float().train()
    # from_pretrained may leave the weights in the file's memory map, which no allocator counts: copy them into
    # allocated memory, as shardtrain's loading does (the same Parameter objects: tied weights stay tied).
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.data = t.data.clone()
    if args.checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.mode != "plain":
        if family == "flava":  # FSDP2 refuses scalar parameters: FLAVA's logit scale as a (1,) tensor, same values
            model.flava.logit_scale = torch.nn.Parameter(model.flava.logit_scale.data.reshape(1))
        mesh = init_device_mesh("cpu", (world,))
        reshard = args.mode == "full_shard"
        for layer in layers_of(model):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    elif world != 1:
        raise SystemExit("--mode plain runs on one process")
    batch = {}
    for k, v in load_file(args.batch).items():
        rows = v.shape[0] // world
        batch[k] = v[rank * rows:(rank + 1) * rows].clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    step_ms, losses, phase_peak, phase_ms = bench_common.timed_steps(hook, args.steps, args.warmup,
                                                                     lambda s: loss_of(family, model, batch), optimizer)
    if args.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            loss_of(family, model, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
        p.export_chrome_trace(args.profile if world == 1 else f"{args.profile}.rank{rank}")
    bench_common.report_and_exit({"impl": "transformers", "family": family, "mode": args.mode,
                                  "checkpoint": args.checkpoint, "world": world}, step_ms, phase_peak, losses,
                                 phase_ms)


if __name__ == "__main__":
    main()
