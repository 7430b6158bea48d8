"""PyTorch's own side of bench/pp_vs_torch.py: the Llama that bench/tp_bench.cpp wrote (a Hugging Face directory) as
transformers' LlamaForCausalLM, cut into stages by whole decoder layers as torchtitan cuts it (the embedding on the
first stage, the final norm and the head on the last, as evenly as the layers divide: the same split as pp_bench's),
each rank's stage(s) a torch.distributed.pipelining PipelineStage run by its schedule (ScheduleGPipe,
Schedule1F1B, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble), on CPU with Gloo. The loss is the shifted
cross-entropy of the head's logits (what transformers' forward computes from them); the same batches and AdamW as
pp_bench.

Run under `shardtrain launch`, one rank per pipeline rank; memory by shardtrain's counting allocator
(libshardtrain_memhook.so). Prints one RESULT line (JSON) on rank 0.
"""
import argparse
import os
import time

import bench_common


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--inputs", required=True)
    p.add_argument("--memhook", required=True)
    p.add_argument("--schedule", required=True, choices=["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"])
    p.add_argument("--microbatches", type=int, required=True)
    p.add_argument("--stages-per-rank", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    hook = bench_common.load_memhook(args.memhook)
    import torch  # after the library: the counter is installed before any tensor exists
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble)
    from transformers import LlamaForCausalLM

    hook.shardtrain_install_cpu_memory_counter()
    rank, world = bench_common.init_gloo()
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(args.inputs, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    ids = torch.load(os.path.join(args.inputs, "ids.pt"))["ids"]
    layers = len(model.model.layers)
    stages = world * args.stages_per_rank
    # models::split_layers: as even as they divide, the first stages one more.
    counts = [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    starts = [sum(counts[:s]) for s in range(stages)]

    class Stage(torch.nn.Module):
        def __init__(self, s):
            super().__init__()
            first, last = s == 0, s == stages - 1
            self.embed = model.model.embed_tokens if first else None
            self.layers = torch.nn.ModuleList(model.model.layers[starts[s]:starts[s] + counts[s]])
            self.rotary = model.model.rotary_emb
            self.norm = model.model.norm if last else None
            self.head = model.lm_head if last else None

        def forward(self, x):
            h = self.embed(x) if self.embed is not None else x
            positions = torch.arange(h.shape[1]).unsqueeze(0)
            rope = self.rotary(h, positions)
            for layer in self.layers:  # no mask: sdpa's causal attention
                h = layer(h, position_ids=positions, position_embeddings=rope)
            return self.head(self.norm(h)) if self.head is not None else h

    mine = [s for s in range(stages) if s % world == rank]  # loop placement, as pp::ScheduleShape::rank_of
    pipeline_stages = [PipelineStage(Stage(s), s, stages, torch.device("cpu")) for s in mine]
    # Only this rank's stages hold parameters from here on (the model's others are dropped with it).
    params = [p for st in pipeline_stages for p in st.submod.parameters()]
    del model

    def loss_fn(logits, target):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))

    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if args.schedule in kinds:
        schedule = kinds[args.schedule](pipeline_stages[0], args.microbatches, loss_fn=loss_fn)
    else:
        kind = ScheduleInterleaved1F1B if args.schedule == "interleaved_1f1b" else ScheduleInterleavedZeroBubble
        schedule = kind(pipeline_stages, args.microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    first, last = 0 in mine, stages - 1 in mine
    step_ms, losses, peak = [], [], 0.0
    for s in range(args.steps + args.warmup):
        hook.shardtrain_reset_cpu_peak()
        t0 = time.perf_counter()
        micro_losses = []
        x = ids[s]
        if first and last:
            schedule.step(x, target=x, losses=micro_losses)
        elif first:
            schedule.step(x)
        elif last:
            schedule.step(target=x, losses=micro_losses)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad()
        ms = (time.perf_counter() - t0) * 1000
        loss = torch.tensor([sum(float(l.detach()) for l in micro_losses) / args.microbatches if last else 0.0],
                            dtype=torch.float64)
        dist.all_reduce(loss)
        losses.append(loss.item())
        if s >= args.warmup:
            step_ms.append(ms)
            peak = max(peak, float(hook.shardtrain_cpu_peak_bytes()))
    summary = torch.tensor([sorted(step_ms)[len(step_ms) // 2], peak], dtype=torch.float64)
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    if rank == 0:
        import json
        print("RESULT " + json.dumps({"impl": "torch", "schedule": args.schedule, "world": world,
                                      "microbatches": args.microbatches, "step_ms": summary[0].item(),
                                      "peak_bytes": summary[1].item(), "losses": losses[args.warmup:]}), flush=True)
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
