"""PyTorch's own side of bench/fsdp_vs_torch.py: the same model, weights, batches and optimizer as
bench/fsdp_bench.cpp, trained with PyTorch's FSDP2 (fully_shard), DDP, or nothing, on CPU with Gloo.

Run under `shardtrain launch` (it sets torchrun's variables and hands rank 0 the rendezvous socket). Memory is
measured by shardtrain's own counting allocator, loaded into this process from libshardtrain_memhook.so, so both
sides are counted alike. Prints one RESULT line (JSON) on rank 0.
"""
import argparse
import ctypes
import datetime
import json
import os
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["plain", "full_shard", "shard_grad_op", "ddp", "ddp_bucket_view"])
    p.add_argument("--inputs", required=True)
    p.add_argument("--memhook", required=True, help="path of libshardtrain_memhook.so")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every block")
    return p.parse_args()


def main():
    args = parse()
    hook = ctypes.CDLL(args.memhook)
    for f in ("shardtrain_cpu_current_bytes", "shardtrain_cpu_peak_bytes"):
        getattr(hook, f).restype = ctypes.c_int64
    import torch  # after the library: c10 is shared, the counter is installed before any tensor exists
    import torch.distributed as dist
    import torch.utils.checkpoint
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    hook.shardtrain_install_cpu_memory_counter()

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))

    class CheckpointedBlock(Block):
        def forward(self, x):  # torch.utils.checkpoint, non-reentrant: what FSDP2 users apply to their blocks
            return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)

    class Model(nn.Module):
        def __init__(self, d, n):
            super().__init__()
            self.embed = nn.Linear(d, d)
            self.blocks = nn.ModuleList((CheckpointedBlock if args.checkpoint else Block)(d) for _ in range(n))
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, d)

        def forward(self, x):
            x = self.embed(x)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    fd = os.environ.get("SHARDTRAIN_MASTER_LISTEN_FD")
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")), world,
                          is_master=rank == 0, timeout=datetime.timedelta(seconds=120),
                          master_listen_fd=int(fd) if (rank == 0 and fd) else None)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)

    def load(name):  # LibTorch's pickle_save tags typed dicts; allow that one function, nothing else
        import torch.jit._pickle
        with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
            return torch.load(os.path.join(args.inputs, name))

    model = Model(args.dim, args.blocks)
    model.load_state_dict(load("init.pt"))
    data = load("data.pt")
    if args.mode in ("full_shard", "shard_grad_op"):
        mesh = init_device_mesh("cpu", (world,))
        reshard = args.mode == "full_shard"
        for b in model.blocks:
            fully_shard(b, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    elif args.mode in ("ddp", "ddp_bucket_view"):
        model = DistributedDataParallel(model, gradient_as_bucket_view=args.mode == "ddp_bucket_view")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    local = args.batch // world
    step_ms, losses = [], []
    phase_peak = [0.0, 0.0, 0.0]  # bytes: the largest peak of forward, backward, step over the timed steps

    def end_phase(phase, timed):
        if timed:
            phase_peak[phase] = max(phase_peak[phase], float(hook.shardtrain_cpu_peak_bytes()))
        hook.shardtrain_reset_cpu_peak()

    for s in range(args.steps + args.warmup):
        timed = s >= args.warmup
        x = data["x"][s][rank * local:(rank + 1) * local]
        y = data["y"][s][rank * local:(rank + 1) * local]
        t0 = time.perf_counter()
        hook.shardtrain_reset_cpu_peak()
        loss = nn.functional.mse_loss(model(x), y)
        end_phase(0, timed)
        loss.backward()
        end_phase(1, timed)
        optimizer.step()
        optimizer.zero_grad()
        end_phase(2, timed)
        ms = (time.perf_counter() - t0) * 1000
        g = loss.detach().clone()
        dist.all_reduce(g)
        if timed:
            step_ms.append(ms)
            losses.append(g.item() / world)
    step_ms.sort()
    summary = torch.tensor([step_ms[len(step_ms) // 2]] + phase_peak, dtype=torch.float64)
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("RESULT " + json.dumps({"impl": "torch", "mode": args.mode, "checkpoint": args.checkpoint, "world": world,
                                      "step_ms": summary[0].item(),
                                      "peak_bytes": summary[1:].max().item(),
                                      "phase_peak_bytes": summary[1:].tolist(), "losses": losses}), flush=True)
    dist.barrier()
    # Leave without destructors: torch 2.11's DDP can deadlock at interpreter exit (the main thread, holding the
    # GIL, joins a Gloo worker thread that waits for the GIL to release a tensor; seen 2026-11-22).
    os._exit(0)


if __name__ == "__main__":
    main()
