"""What the Python sides of the benchmarks share: running a launched command for its RESULT line; in a worker, the
counting allocator (libshardtrain_memhook.so, loaded before torch so that every tensor is counted), the Gloo
process group from `shardtrain launch`'s environment, and the timed loop with its RESULT line — the same
measurements as the C++ sides' (bench/bench_loop.h): median step of the slowest rank, peak bytes of each phase of
a step (forward with the loss, backward, optimizer step with zero_grad) on the largest rank.
"""
import ctypes
import datetime
import json
import os
import subprocess
import sys
import time


def run_result(cmd):
    """Runs `cmd` and returns its RESULT line's JSON; exits with its output when there is none."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    sys.exit(f"no RESULT from {' '.join(cmd)} (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def load_memhook(path):
    """The counting allocator's C API. Call before importing torch; then install_counter()."""
    hook = ctypes.CDLL(path)
    for f in ("shardtrain_cpu_current_bytes", "shardtrain_cpu_peak_bytes"):
        getattr(hook, f).restype = ctypes.c_int64
    return hook


def init_gloo():
    """The Gloo process group of a worker started by `shardtrain launch` (rank 0 takes over the launcher's listening
    socket). Returns (rank, world)."""
    import torch.distributed as dist
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    fd = os.environ.get("SHARDTRAIN_MASTER_LISTEN_FD")
    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")), world,
                          is_master=rank == 0, timeout=datetime.timedelta(seconds=120),
                          master_listen_fd=int(fd) if (rank == 0 and fd) else None)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return rank, world


def timed_steps(hook, steps, warmup, loss_of_step, optimizer):
    """warmup + steps training steps: loss_of_step(s) returns step s's loss. Returns (milliseconds of the timed steps,
    every step's loss averaged over the ranks, the largest peak bytes of each phase over the timed steps, each
    phase's milliseconds in the timed steps)."""
    import torch
    import torch.distributed as dist
    world = dist.get_world_size()
    step_ms, losses, phase_peak, phase_ms = [], [], [0.0, 0.0, 0.0], [[], [], []]
    phase_start = 0.0

    def end_phase(phase, timed):
        nonlocal phase_start
        now = time.perf_counter()
        if timed:
            phase_peak[phase] = max(phase_peak[phase], float(hook.shardtrain_cpu_peak_bytes()))
            phase_ms[phase].append((now - phase_start) * 1000)
        hook.shardtrain_reset_cpu_peak()
        phase_start = now

    for s in range(steps + warmup):
        timed = s >= warmup
        t0 = phase_start = time.perf_counter()
        hook.shardtrain_reset_cpu_peak()
        loss = loss_of_step(s)
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
    return step_ms, losses, phase_peak, phase_ms


def report_and_exit(fields, step_ms, phase_peak, losses, phase_ms):
    """Rank 0 prints RESULT {fields..., step_ms, phase_ms, peak_bytes, phase_peak_bytes, losses} (the slowest rank's
    median step and phases, the largest rank's peaks); then every rank leaves without destructors: torch 2.11's DDP
    can deadlock at interpreter exit (the main thread, holding the GIL, joins a Gloo worker thread that waits for the
    GIL to release a tensor; seen 2026-11-22)."""
    import torch
    import torch.distributed as dist

    def median(ms):
        return sorted(ms)[len(ms) // 2]

    summary = torch.tensor([median(step_ms)] + [median(ms) for ms in phase_ms] + phase_peak, dtype=torch.float64)
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(dict(fields, step_ms=summary[0].item(), phase_ms=summary[1:4].tolist(),
                                          peak_bytes=summary[4:].max().item(), phase_peak_bytes=summary[4:].tolist(),
                                          losses=losses)), flush=True)
    dist.barrier()
    os._exit(0)
