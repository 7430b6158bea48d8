"""PyTorch's own side of bench/tp_vs_torch.py: the Llama that bench/tp_bench.cpp wrote (a Hugging Face directory)
as transformers' LlamaForCausalLM, split with PyTorch's tensor parallelism (parallelize_module: q, k, v, gate, up
ColwiseParallel; o, down RowwiseParallel; the embedding RowwiseParallel over the vocabulary; the LM head
ColwiseParallel, its logits gathered for transformers' loss) and, over the data-parallel ranks, FSDP2 (fully_shard
on every decoder layer and the root), on CPU with Gloo. The same batches and AdamW as tp_bench.

Run under `shardtrain launch`; memory by shardtrain's counting allocator (libshardtrain_memhook.so). Prints one
RESULT line (JSON) on rank 0.
"""
import argparse
import os

import bench_common


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--inputs", required=True)
    p.add_argument("--memhook", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sequence-parallel", action="store_true")
    args = p.parse_args()
    hook = bench_common.load_memhook(args.memhook)
    import torch  # after the library: the counter is installed before any tensor exists
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    from transformers import LlamaForCausalLM

    hook.shardtrain_install_cpu_memory_counter()
    rank, world = bench_common.init_gloo()
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(args.inputs, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    ids = torch.load(os.path.join(args.inputs, "ids.pt"))["ids"]
    dp = world // args.tp
    mesh = init_device_mesh("cpu", (dp, args.tp), mesh_dim_names=("dp", "tp"))
    if args.tp > 1 and args.sequence_parallel:
        # torchtitan's plan: the stream between the regions sharded on the sequence (kept a DTensor through
        # transformers' code, which reads its global length), the norms sequence parallel, each region's input
        # gathered (the attention's arrives as a keyword).
        tp_mesh = mesh["tp"]
        parallelize_module(model, tp_mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
        for layer in model.model.layers:
            parallelize_module(layer, tp_mesh, {
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(),
                "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
    elif args.tp > 1:
        tp_mesh = mesh["tp"]
        parallelize_module(model.model.embed_tokens, tp_mesh, RowwiseParallel(input_layouts=Replicate()))
        parallelize_module(model.lm_head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))
        for layer in model.model.layers:
            parallelize_module(layer, tp_mesh, {
                "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel()})
    if dp > 1:
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    rows = ids.shape[1] // dp
    dp_rank = rank // args.tp

    def loss_of_step(s):
        x = ids[s][dp_rank * rows:(dp_rank + 1) * rows]
        return model(input_ids=x, labels=x).loss

    step_ms, losses, phase_peak, phase_ms = bench_common.timed_steps(hook, args.steps, args.warmup, loss_of_step,
                                                                     optimizer)
    bench_common.report_and_exit({"impl": "torch", "tp": args.tp, "world": world,
                                  "sequence_parallel": args.sequence_parallel},
                                 step_ms, phase_peak, losses[args.warmup:], phase_ms)


if __name__ == "__main__":
    main()
