"""Python's view of the files shardtrain writes with torch.save's format (checkpoints' model, optimizer and RNG
files, sharded and full state dicts): every *.pt under DIR must load with torch.load's defaults (weights_only=True
since PyTorch 2.6, which refuses any global outside its allow-list) onto the CPU. In a sharded state dict's file each
tensor's trailing shape must be the one its "shapes" entry records (its rows are the file's share).

usage: torch_load_check.py DIR
prints: torch.load read N files, M tensors
"""
import os
import sys

import torch


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)


def main():
    root = sys.argv[1]
    files = tensors = 0
    for dirpath, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if not name.endswith(".pt"):
                continue
            path = os.path.join(dirpath, name)
            try:
                value = torch.load(path, map_location="cpu")
            except Exception as e:  # noqa: BLE001 - the message is the finding
                reason = [line for line in str(e).splitlines() if "WeightsUnpickler error" in line]
                print(f"torch.load failed on {path}: {(reason or str(e).splitlines())[0].strip()}")
                return 1
            if isinstance(value, dict) and "tensors" in value and "shapes" in value:
                for key, t in value["tensors"].items():
                    shape = list(value["shapes"][key])
                    if list(t.shape[1:]) != shape[1:]:
                        print(f"{path}: '{key}' has shape {list(t.shape)}, its entry says {shape}")
                        return 1
            files += 1
            tensors += sum(1 for _ in tensors_in(value))
    if files == 0:
        print(f"no .pt file under {root}")
        return 1
    print(f"torch.load read {files} files, {tensors} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
