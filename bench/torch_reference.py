"""PyTorch's own side of bench/fsdp_vs_torch.py: the same model, weights, batches and optimizer as
bench/fsdp_bench.cpp, trained with PyTorch's FSDP2 (fully_shard), DDP, or nothing, on CPU with Gloo.

Run under `shardtrain launch` (it sets torchrun's variables and hands rank 0 the rendezvous socket). Memory is
measured by shardtrain's own counting allocator, loaded into this process from libshardtrain_memhook.so, so both
sides are counted alike. Prints one RESULT line (JSON) on rank 0.
"""
import argparse
import os

import bench_common


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
    hook = bench_common.load_memhook(args.memhook)
    import torch  # after the library: c10 is shared, the counter is installed before any tensor exists
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

    rank, world = bench_common.init_gloo()

    def load(name):  # written by io::save_pickle: torch.load's defaults read it
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

    def loss_of_step(s):
        x = data["x"][s][rank * local:(rank + 1) * local]
        y = data["y"][s][rank * local:(rank + 1) * local]
        return nn.functional.mse_loss(model(x), y)

    step_ms, losses, phase_peak, phase_ms = bench_common.timed_steps(hook, args.steps, args.warmup, loss_of_step,
                                                                     optimizer)
    bench_common.report_and_exit({"impl": "torch", "mode": args.mode, "checkpoint": args.checkpoint, "world": world},
                                 step_ms, phase_peak, losses[args.warmup:], phase_ms)


if __name__ == "__main__":
    main()
