"""PyTorch distributed checkpoints (torch.distributed.checkpoint, "DCP") of a Hugging Face model, as an FSDP2 job
saves them: W processes (Gloo on loopback, meeting through a file store: no port to choose) load the model with from_pretrained, shard it with fully_shard, make
AdamW's state (a step with learning rate 0, so the weights stay those of the model directory) and dcp.save the
model's and the optimizer's state dicts. The weights in the checkpoint are exactly the directory's:
tests/models/hf_parity_test.cpp loads both and compares.

  nested=True:  {"model": model_sd, "optim": optim_sd, "step": 7}  (FSDP2's recipes, Accelerate)
  nested=False: {**model_sd, "optimizer": optim_sd}                 (a model state dict at the top)
  accelerate=True: {"model": model.state_dict()} in out_dir/pytorch_model_fsdp_0/, as Accelerate's save_state
                writes an FSDP model with fsdp_state_dict_type SHARDED_STATE_DICT (accelerate/utils/fsdp_utils.py)
  dim1=True:    2-D parameters whose columns divide evenly sharded along dimension 1 (fully_shard's
                shard_placement_fn); others along dimension 0, where a world of 3 makes chunks uneven

usage (from hf_reference.py): save_dcp(model_dir, out_dir, "BertForPreTraining", world=3, nested=True)
                               write_faults(out_dir, faults_dir)
"""
import dataclasses
import os
import pickle
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import transformers
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard


def _rank(rank, world, store, model_dir, out_dir, class_name, nested, dim1, accelerate):
    # Forked from a process that has computed (see save_dcp): one intra-op thread, so that no OpenMP region runs in
    # a child of a process whose OpenMP threads it did not inherit.
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # Gloo's pairs on loopback too
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    try:
        transformers.logging.set_verbosity_error()
        model = getattr(transformers, class_name).from_pretrained(model_dir)
        placement = (lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % world == 0 else None) if dim1 else None
        fully_shard(model, shard_placement_fn=placement)
        opt = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        model_sd = get_model_state_dict(model)
        optim_sd = get_optimizer_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd, "step": 7} if nested else {**model_sd, "optimizer": optim_sd}
        if accelerate:
            state, out_dir = {"model": model.state_dict()}, os.path.join(out_dir, "pytorch_model_fsdp_0")
        dcp.save(state, checkpoint_id=out_dir)
    finally:
        dist.destroy_process_group()
    # Saved: leave without the interpreter's teardown, where torch 2.11's Gloo threads abort the process about once
    # in 40 runs here ("terminate called without an active exception", SIGABRT) after the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def save_dcp(model_dir, out_dir, class_name, world, nested, dim1=False, accelerate=False):
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(model_dir, "config.json"), out_dir)
    for attempt in (1, 2):  # a rank killed by a signal (see _rank's end) is tried once more, from the start
        with tempfile.TemporaryDirectory() as meeting:
            try:
                # Forked, not spawned: a spawned rank imports torch and transformers again (seconds each).
                mp.start_processes(_rank, args=(world, os.path.join(meeting, "store"), model_dir, out_dir, class_name,
                                                nested, dim1, accelerate), nprocs=world, join=True,
                                   start_method="fork")
                return
            except mp.ProcessExitedException as e:
                if attempt == 2 or e.signal_name is None:
                    raise
                print("dcp_reference: %s; saving again" % e, file=sys.stderr)


def save_compiled_names(model_dir, out_dir):
    """The directory's weights saved by one process as a torch.compile'd model's state dict names them
    ("_orig_mod.bert.embeddings..."), the model's entries at the top beside a plain value."""
    from safetensors.torch import load_file
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(model_dir, "config.json"), out_dir)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    dcp.save({**{"_orig_mod." + k: v for k, v in weights.items()}, "epoch": 2}, checkpoint_id=out_dir, no_dist=True)


class _RunsCode:
    """Unpickled, this would run a shell command: a reader must refuse to call os.system."""

    def __reduce__(self):
        return (os.system, ("true",))


@dataclasses.dataclass
class _Note:
    text: str = "a class outside DCP's"


def write_faults(src, root):
    """Damaged copies of the checkpoint in src, one per root/<name>, each something a reader must refuse and say
    why: a data file missing or truncated, a chunk missing from the metadata, a chunk stored through a writer
    extension (zstd), metadata that calls os.system or makes an object of a class outside DCP's."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    def copy(name):
        d = os.path.join(root, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        return d

    def rewrite(name, change):
        d = copy(name)
        with open(os.path.join(d, ".metadata"), "rb") as f:
            metadata = pickle.load(f)
        change(metadata)
        with open(os.path.join(d, ".metadata"), "wb") as f:
            pickle.dump(metadata, f)

    os.remove(os.path.join(copy("missing-file"), "__1_0.distcp"))
    with open(os.path.join(src, ".metadata"), "rb") as f:
        storage = pickle.load(f).storage_data
    model_bytes = max(s.offset + s.length for i, s in storage.items()
                      if s.relative_path == "__0_0.distcp" and i.fqn.startswith("model."))
    os.truncate(os.path.join(copy("truncated"), "__0_0.distcp"), model_bytes // 2)  # inside the model's chunks

    def drop_chunk(m):
        key = next(k for k, v in m.state_dict_metadata.items()
                   if isinstance(v, TensorStorageMetadata) and len(v.chunks) > 1)
        m.state_dict_metadata[key].chunks.pop()
    rewrite("missing-chunk", drop_chunk)

    def compress(m):
        next(iter(m.storage_data.values())).transform_descriptors = ["zstd"]
    rewrite("compressed", compress)
    rewrite("calls-code", lambda m: m.planner_data.update(runs=_RunsCode()))
    rewrite("other-class", lambda m: m.planner_data.update(note=_Note()))


if __name__ == "__main__":
    # dcp_reference.py MODEL_DIR OUT_DIR CLASS WORLD: the model directory's weights as a W-rank FSDP2 job's
    # checkpoint, its model under "model" (what tests/train/train_test.cpp trains from).
    save_dcp(sys.argv[1], sys.argv[2], sys.argv[3], world=int(sys.argv[4]), nested=True)
