"""Our tensor parallelism against PyTorch's (parallelize_module + fully_shard, on transformers' LlamaForCausalLM)
on the same Llama, weights and batches, in one run: step time and peak CPU memory per rank (shardtrain's counting
allocator on both sides), their ratios, and the losses side by side. Shapes are swept (each a llama-debug with
model.overrides); layouts tp 2 at world size 2 and dp 2 x tp 2 at world size 4, ours also with sequence
parallelism (PyTorch's side without: its Llama needs a SequenceParallel plan over transformers' keyword inputs).

    .venv/bin/python bench/tp_vs_torch.py [--build build] [--steps 8] [--shapes small,wide]

On CPU the ranks of one machine share its cores: the ratios compare the two implementations, not what tensor
parallelism pays on a GPU node (docs/notes/benchmarks.md).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import bench_common

# name -> (model.overrides of llama-debug, batch rows, tokens per row)
SHAPES = {
    "small": ("dim=256,layers=4,heads=8,kv_heads=4,mlp_dim=688,vocab_size=8000,max_positions=1024", 8, 256),
    "wide": ("dim=512,layers=4,heads=8,kv_heads=8,mlp_dim=1376,vocab_size=32000,max_positions=1024", 4, 256),
    "long": ("dim=256,layers=2,heads=4,kv_heads=2,mlp_dim=688,vocab_size=8000,max_positions=1024", 2, 1024),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--shapes", default="small,wide,long")
    a = p.parse_args()
    launcher = os.path.join(a.build, "shardtrain")
    ours = os.path.join(a.build, "tp_bench")
    memhook = os.path.abspath(os.path.join(a.build, "libshardtrain_memhook.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    rows = []
    for shape in a.shapes.split(","):
        overrides, batch, seq = SHAPES[shape]
        with tempfile.TemporaryDirectory(prefix="shardtrain-tp-bench-") as inputs:
            subprocess.run([ours, "--write-inputs", inputs, "--flavor", "llama-debug", "--overrides", overrides,
                            "--batch", str(batch), "--seq", str(seq), "--steps", str(a.steps)], check=True)
            for world, tp in ((2, 2), (4, 2)):
                def launch(cmd):
                    return [launcher, "launch", "--nproc-per-node", str(world), "--"] + cmd

                print(f"  {shape}: W={world} tp={tp}", file=sys.stderr, flush=True)
                torch_r = bench_common.run_result(launch(
                    [sys.executable, os.path.join(here, "tp_reference.py"), "--inputs", inputs, "--memhook", memhook,
                     "--tp", str(tp), "--steps", str(a.steps)]))
                for sp in (False, True):
                    ours_r = bench_common.run_result(launch(
                        [ours, "--inputs", inputs, "--tp", str(tp), "--steps", str(a.steps)] +
                        (["--sequence-parallel"] if sp else [])))
                    loss_diff = max(abs(x - y) for x, y in zip(ours_r["losses"], torch_r["losses"]))
                    rows.append((shape, world, tp, sp, ours_r, torch_r, loss_diff))
    print(f"{'shape':6s} {'W':>2s} {'dp x tp':>8s} {'seq-par':>7s} {'ours ms':>8s} {'torch ms':>8s} {'time':>6s} "
          f"{'ours MiB':>8s} {'torch MiB':>9s} {'memory':>6s} {'|loss diff|':>11s}")
    for shape, world, tp, sp, o, t, d in rows:
        mib = 1024 * 1024
        print(f"{shape:6s} {world:2d} {f'{world // tp} x {tp}':>8s} {'yes' if sp else 'no':>7s} {o['step_ms']:8.1f} "
              f"{t['step_ms']:8.1f} {o['step_ms'] / t['step_ms']:5.2f}x {o['peak_bytes'] / mib:8.1f} "
              f"{t['peak_bytes'] / mib:9.1f} {o['peak_bytes'] / t['peak_bytes']:5.2f}x {d:11.2e}")


if __name__ == "__main__":
    main()
