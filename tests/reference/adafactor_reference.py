"""Hugging Face transformers' Adafactor on fixed gradients: the reference for optim::Adafactor.

Writes OUT/adafactor/cases.json (each case's options) and OUT/adafactor/steps.safetensors: for case k and
parameter i, "k.i.init" (the starting value), "k.i.grad.t" (the gradient given at step t), "k.i.final" (the value
after the last step) and "k.i.<state>" for every state tensor transformers keeps (exp_avg, exp_avg_sq,
exp_avg_sq_row, exp_avg_sq_col). The parameters cover what factoring distinguishes: a matrix, a matrix of one
column, a vector, a scalar, and a 3-dimensional tensor.

Usage: adafactor_reference.py OUT
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers.optimization import Adafactor

SHAPES = [(37, 11), (6, 1), (1000,), (), (4, 3, 5)]
STEPS = 7

CASES = [
    # transformers' defaults: relative step scaled by the parameter's RMS
    {"name": "defaults", "lr": None, "relative_step": True, "scale_parameter": True, "warmup_init": False},
    # Hugging Face Trainer's set-up: the learning rate given, a first moment, weight decay
    {"name": "trainer", "lr": 1e-2, "relative_step": False, "scale_parameter": False, "warmup_init": False,
     "beta1": 0.9, "weight_decay": 0.1},
    # warm-up of the relative step, a tighter clip, another decay
    {"name": "warmup", "lr": None, "relative_step": True, "scale_parameter": True, "warmup_init": True,
     "clip_threshold": 0.5, "decay_rate": -0.5, "eps": [1e-30, 1e-2]},
    # bfloat16 parameters: updated in float32 and rounded back
    {"name": "bf16", "lr": 3e-2, "relative_step": False, "scale_parameter": True, "warmup_init": False,
     "dtype": "bfloat16"},
]


def run(case, generator):
    dtype = getattr(torch, case.get("dtype", "float32"))
    params = [torch.randn(s, generator=generator).to(dtype).requires_grad_() for s in SHAPES]
    tensors = {}
    for i, p in enumerate(params):
        tensors[f"{case['index']}.{i}.init"] = p.detach().clone()
    optimizer = Adafactor(params, lr=case["lr"], eps=tuple(case.get("eps", (1e-30, 1e-3))),
                          clip_threshold=case.get("clip_threshold", 1.0), decay_rate=case.get("decay_rate", -0.8),
                          beta1=case.get("beta1"), weight_decay=case.get("weight_decay", 0.0),
                          scale_parameter=case["scale_parameter"], relative_step=case["relative_step"],
                          warmup_init=case["warmup_init"])
    for t in range(STEPS):
        for i, p in enumerate(params):
            # gradients of changing scale, some rows much larger than others (what factoring has to follow)
            g = torch.randn(p.shape, generator=generator) * (0.1 + t)
            if p.dim() >= 1 and p.shape[0] > 1:
                g[0] *= 30
            p.grad = g.to(dtype)
            tensors[f"{case['index']}.{i}.grad.{t}"] = p.grad.clone()
        optimizer.step()
    for i, p in enumerate(params):
        tensors[f"{case['index']}.{i}.final"] = p.detach().clone()
        for key, value in optimizer.state[p].items():
            if isinstance(value, torch.Tensor) and key != "RMS":
                tensors[f"{case['index']}.{i}.{key}"] = value.clone()
    return tensors


def main():
    out = os.path.join(sys.argv[1], "adafactor")
    os.makedirs(out, exist_ok=True)
    generator = torch.Generator().manual_seed(5)
    tensors = {}
    for index, case in enumerate(CASES):
        case["index"] = index
        tensors.update(run(case, generator))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "steps.safetensors"))
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump({"steps": STEPS, "shapes": [list(s) for s in SHAPES], "cases": CASES}, f, indent=1)
    print(f"adafactor reference: {len(CASES)} cases, {STEPS} steps, {len(tensors)} tensors in {out}")


if __name__ == "__main__":
    main()
