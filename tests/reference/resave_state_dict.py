"""A state dict that shardtrain wrote (fsdp::save_full_state_dict), saved again as Python's torch.save writes a
model's state_dict(): an OrderedDict carrying its _metadata attribute, in the zip format and in the legacy one
(PyTorch before 1.6). tests/multiprocess/state_dict_test.cpp loads both back into a sharded model.

usage: resave_state_dict.py IN.pt OUT_ZIP.pt OUT_LEGACY.pt
"""
import collections
import sys

import torch


def main():
    state = torch.load(sys.argv[1])  # torch.load's defaults: weights_only=True
    ordered = collections.OrderedDict(state)
    ordered._metadata = collections.OrderedDict({"": {"version": 1}})
    torch.save(ordered, sys.argv[2])
    torch.save(ordered, sys.argv[3], _use_new_zipfile_serialization=False)
    print(f"resaved {len(ordered)} tensors")


if __name__ == "__main__":
    main()
