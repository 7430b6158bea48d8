"""Where two profiled steps spend their time, operator by operator: reads the Chrome traces that
`family_bench --profile` (LibTorch's Kineto profiler) and `hf_family_step.py --profile` (torch.profiler) write for
one training step, and prints each ATen operator's self time (its time less that of the operators it called, on
the thread it ran on) and call count on both sides, largest difference first.

  .venv/bin/python bench/profile_compare.py OURS.json THEIRS.json [--top 30] [--shapes]

--shapes keys the operators by their input shapes as well (both traces record them), to tell apart, say, the
matrix products of attention from those of the MLP.

Then the annotated regions of each side, total (inclusive) time and count by name, the module named in it left
out: FSDP2's "FSDP::..." regions (all_gather, all_gather_copy_out, post_backward_reduce, ...) and ours (lib/core/src/fsdp:
FSDP::all_gather, FSDP::all_gather_copy_out, FSDP::agree_on_gradients, FSDP::reduce_scatter,
FSDP::wait_reduce_scatter, FSDP::post_backward, FSDP::install_gradients), and Gloo's own ("gloo:send", ...). A
region's time includes waiting: the time one rank spent on another.
"""
import argparse
import collections
import json
import re


def self_times(path, with_shapes):
    """{operator key: [self microseconds, calls]} over the CPU operators of a Chrome trace."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            by_thread[e.get("tid")].append(e)
    totals = collections.defaultdict(lambda: [0.0, 0])
    for ops in by_thread.values():
        # Sorted by start, longest first on ties: an operator's children start within it and end before it does.
        ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack = []  # [end time, key, self time so far]

        def close(entry):
            totals[entry[1]][0] += entry[2]

        for e in ops:
            start, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1][0] <= start:
                close(stack.pop())
            if stack:
                stack[-1][2] -= dur
            key = e["name"]
            if with_shapes:
                key += " " + str(e.get("args", {}).get("Input Dims", ""))
            totals[key][1] += 1
            stack.append([start + dur, key, dur])
        while stack:
            close(stack.pop())
    return totals


def annotated(path):
    """{region name: [inclusive microseconds, count]} over the user annotations of a Chrome trace."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    totals = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation":
            key = re.sub(r" (\(.*\)|for .*)$", "", e["name"])
            totals[key][0] += float(e["dur"])
            totals[key][1] += 1
    return totals


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ours")
    p.add_argument("theirs")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--shapes", action="store_true")
    args = p.parse_args()
    ours, theirs = self_times(args.ours, args.shapes), self_times(args.theirs, args.shapes)
    keys = sorted(set(ours) | set(theirs), key=lambda k: -abs(ours.get(k, [0, 0])[0] - theirs.get(k, [0, 0])[0]))
    total_ours = sum(v[0] for v in ours.values()) / 1000
    total_theirs = sum(v[0] for v in theirs.values()) / 1000
    print(f"self time of every operator: ours {total_ours:.1f} ms, theirs {total_theirs:.1f} ms")
    print(f"{'ours ms':>9} {'calls':>6} {'theirs ms':>9} {'calls':>6} {'diff ms':>8}  operator")
    for k in keys[:args.top]:
        o, t = ours.get(k, [0.0, 0]), theirs.get(k, [0.0, 0])
        print(f"{o[0] / 1000:9.1f} {o[1]:6d} {t[0] / 1000:9.1f} {t[1]:6d} {(o[0] - t[0]) / 1000:8.1f}  {k[:150]}")
    ours, theirs = annotated(args.ours), annotated(args.theirs)
    if ours or theirs:
        print("\nannotated regions, total time (waits included):")
        print(f"{'ours ms':>9} {'count':>6} {'theirs ms':>9} {'count':>6}  region")
        for k in sorted(set(ours) | set(theirs)):
            o, t = ours.get(k, [0.0, 0]), theirs.get(k, [0.0, 0])
            print(f"{o[0] / 1000:9.1f} {o[1]:6d} {t[0] / 1000:9.1f} {t[1]:6d}  {k}")


if __name__ == "__main__":
    main()
