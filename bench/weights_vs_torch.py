"""Loading a model's weights from each form a checkpoint comes in — model.safetensors, a torch.save
pytorch_model.bin, an FSDP2 job's distributed checkpoint (torch.distributed.checkpoint, 2 ranks) — into the built
model, ours (build/weights_bench: load_weights) beside PyTorch's own way for the same files in the same run:
safetensors.torch.load_file + load_state_dict, torch.load(mmap=True, weights_only=True) + load_state_dict,
dcp.load in place. Seconds (the fastest of --repeats; the files in the page cache after the first) and the bytes a
load allocates above the model's own, counted by shardtrain's allocator on both sides (libshardtrain_memhook.so).
The model: BERT base for masked LM (110M parameters, float32), random weights.

usage: .venv/bin/python bench/weights_vs_torch.py [--build build] [--out /tmp/shardtrain_weights_bench] [--repeats 3]
"""
import argparse
import json
import os
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import bench_common  # noqa: E402

FORMATS = ("safetensors", "bin", "dcp")


def make_dirs(out):
    """out/{safetensors,bin,dcp}: the same random BERT base weights in each form, each with its config.json."""
    import torch
    import transformers
    sys.path.insert(0, os.path.join(here, "..", "tests", "reference"))
    from dcp_reference import save_dcp
    dirs = {f: os.path.join(out, f) for f in FORMATS}
    if all(os.path.exists(os.path.join(d, "config.json")) for d in dirs.values()):
        return dirs
    torch.manual_seed(0)
    config = transformers.BertConfig(architectures=["BertForMaskedLM"])
    model = transformers.BertForMaskedLM(config)
    model.save_pretrained(dirs["safetensors"], safe_serialization=True)
    os.makedirs(dirs["bin"], exist_ok=True)
    model.config.save_pretrained(dirs["bin"])
    torch.save(model.state_dict(), os.path.join(dirs["bin"], "pytorch_model.bin"))
    save_dcp(dirs["safetensors"], dirs["dcp"], "BertForMaskedLM", world=2, nested=True)
    return dirs


def worker(fmt, d, repeats, memhook):
    """PyTorch's loading of directory d (form fmt) into a built model; prints RESULT."""
    hook = bench_common.load_memhook(memhook)
    import torch
    import transformers
    hook.shardtrain_install_cpu_memory_counter()
    transformers.logging.set_verbosity_error()
    model = transformers.BertForMaskedLM(transformers.BertConfig.from_pretrained(d))
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    best, extra = 1e30, 0
    for _ in range(repeats):
        hook.shardtrain_reset_cpu_peak()
        before = hook.shardtrain_cpu_current_bytes()
        t0 = time.perf_counter()
        if fmt == "safetensors":
            from safetensors.torch import load_file
            model.load_state_dict(load_file(os.path.join(d, "model.safetensors")), strict=False)
        elif fmt == "bin":
            state = torch.load(os.path.join(d, "pytorch_model.bin"), mmap=True, weights_only=True)
            model.load_state_dict(state, strict=False)
            del state
        else:
            import torch.distributed.checkpoint as dcp
            state = {"model": model.state_dict()}
            dcp.load(state, checkpoint_id=d, no_dist=True)
        best = min(best, time.perf_counter() - t0)
        extra = max(extra, hook.shardtrain_cpu_peak_bytes() - before)
    print("RESULT " + json.dumps({"seconds": best, "extra_bytes": extra, "model_bytes": model_bytes}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--out", default="/tmp/shardtrain_weights_bench")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", nargs=2, metavar=("FORMAT", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--memhook", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker[0], a.worker[1], a.repeats, a.memhook)
        return
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    print(f"weights_vs_torch: writing BERT base (110M parameters) in {len(FORMATS)} forms under {a.out}", flush=True)
    dirs = make_dirs(a.out)
    ours = bench_common.run_result([os.path.join(a.build, "weights_bench"), "--repeats", str(a.repeats)] +
                                   [dirs[f] for f in FORMATS])
    print(f"{'form':<12} {'ours s':>8} {'torch s':>8} {'ratio':>6}   {'ours MB':>8} {'torch MB':>8}   "
          "(MB: allocated above the model's own while loading)")
    for f in FORMATS:
        theirs = bench_common.run_result([sys.executable, os.path.abspath(__file__), "--worker", f, dirs[f],
                                          "--repeats", str(a.repeats), "--memhook", memhook])
        o = ours[dirs[f]]
        print(f"{f:<12} {o['seconds']:8.3f} {theirs['seconds']:8.3f} {o['seconds'] / theirs['seconds']:6.2f}   "
              f"{o['extra_bytes'] / 1e6:8.1f} {theirs['extra_bytes'] / 1e6:8.1f}", flush=True)


if __name__ == "__main__":
    main()
