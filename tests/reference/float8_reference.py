"""torchao's Float8Linear on fixed inputs: the reference for nn::float8_linear (issue 64).

Writes OUT/float8/cases.safetensors: for each recipe R (tensorwise, rowwise) and case k, "R.k.x" (the input,
(B, T, in) in bf16 or float32), "R.k.weight" (out, in), "R.k.grad_y" (the output's gradient), and torchao's
"R.k.y", "R.k.grad_x", "R.k.grad_weight". Tensorwise runs torchao's own float8 GEMMs (torch._scaled_mm, which the
CPU has); rowwise, whose per-row scales the CPU's _scaled_mm lacks, runs torchao's emulation (its `emulate`
option: the float8 operands divided by their scales, multiplied in float32) — the same casts, the product in
float32 rounded once. Cases: widths that divide by 16 as float8 tensor cores need, a batch of rows with one
outlier (its scale differs from the rest's), values beyond float8's range, a row of zeros.

Usage: float8_reference.py OUT
"""

import dataclasses
import os
import sys

import torch
from safetensors.torch import save_file
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

CASES = [  # (batch, tokens, in, out, dtype)
    (2, 24, 64, 96, torch.bfloat16),
    (3, 16, 128, 32, torch.bfloat16),
    (1, 32, 48, 80, torch.float32),
]


def inputs(k, batch, tokens, d_in, d_out, dtype):
    g = torch.Generator().manual_seed(1000 + k)
    x = torch.randn(batch, tokens, d_in, generator=g)
    x[0, 3] *= 40  # an outlier row: its own scale under rowwise, everyone's under tensorwise
    x[-1, -1] = 0  # a row of zeros: the scale's floor
    weight = torch.randn(d_out, d_in, generator=g) / d_in**0.5
    weight[5, 7] = 1e4 if dtype == torch.float32 else 3e3  # beyond e4m3's 448 once scaled: saturates
    grad_y = torch.randn(batch, tokens, d_out, generator=g) * 1e-3
    return x.to(dtype), weight.to(dtype), grad_y.to(dtype)


def main():
    out = os.path.join(sys.argv[1], "float8")
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for recipe in ("tensorwise", "rowwise"):
        config = Float8LinearConfig.from_recipe_name(recipe)
        if recipe == "rowwise":
            config = dataclasses.replace(config, emulate=True)
        for k, (batch, tokens, d_in, d_out, dtype) in enumerate(CASES):
            x, weight, grad_y = inputs(k, batch, tokens, d_in, d_out, dtype)
            layer = torch.nn.Linear(d_in, d_out, bias=False, dtype=dtype)
            with torch.no_grad():
                layer.weight.copy_(weight)
            model = convert_to_float8_training(torch.nn.Sequential(layer), config=config)
            x_leaf = x.clone().requires_grad_()
            y = model(x_leaf)
            y.backward(grad_y)
            prefix = f"{recipe}.{k}."
            tensors.update({prefix + "x": x, prefix + "weight": weight, prefix + "grad_y": grad_y,
                            prefix + "y": y.detach(), prefix + "grad_x": x_leaf.grad,
                            prefix + "grad_weight": model[0].weight.grad})
    save_file({name: t.contiguous() for name, t in tensors.items()}, os.path.join(out, "cases.safetensors"))
    print(f"wrote {len(tensors)} tensors to {out}")


if __name__ == "__main__":
    main()
