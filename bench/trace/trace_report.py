#!/usr/bin/env python3
"""Where a forward step's GPU time goes, from a bench/trace/cuda_trace.cc recording.

  python3 bench/trace/trace_report.py TRACE.csv [--device 0] [--detail 2] [--kinds decode,...]

The timeline of each GPU is cut into steps at every embedding kernel (each CudaModel forward step
starts with one; its grid is the step's token count). A step of at most 64 tokens is `decode`, a
longer one `prefill-select` when it scored keys (a TokenSelect / top-k chunk) and `prefill`
otherwise (both may run as CUDA graphs: whole decode steps and whole prefill chunks). For each kind the report prints the
median step time (first op start to last op end), the time the GPU was busy in it, and the
kernels' time per step, most expensive first; with --detail L it also lists every op of layer L
of the median step with its start, duration and the idle gap before it.
"""

import argparse
import collections
import re
import statistics
import sys


def base_name(name):
    """A kernel's function name without namespaces, template arguments or parameters."""
    name = name.replace("(anonymous namespace)", "anon")
    if name.startswith("void "):
        name = name[5:]
    name = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out).split("::")[-1].strip()
    if short in ("Kernel", "Kernel2", "device_kernel") and "<" in name:  # CUTLASS: name the tile
        short = name[name.index("<") + 1:].split(">")[0].split("::")[-1][:80]
    return short or name[:60]


def load(path):
    ops = collections.defaultdict(list)  # device -> [(start, end, name, graph, grid blocks)]
    names = {}
    kernels = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(",", 2 if line.startswith("N,") else 9)
            kind = parts[0]
            if kind == "K":
                _, dev, _, start, end, graph, grid, _, name_id = parts
                kernels.append((int(dev), int(start), int(end), int(name_id), int(graph),
                                int(grid)))
            elif kind == "M":
                _, dev, _, start, end, copy_kind, nbytes = parts
                label = {1: "memcpy HtoD", 2: "memcpy DtoH", 8: "memcpy DtoD",
                         10: "memcpy PtoP"}.get(int(copy_kind), "memcpy")
                ops[int(dev)].append((int(start), int(end), label, 0, 0))
            elif kind == "S":
                _, dev, _, start, end, _ = parts
                ops[int(dev)].append((int(start), int(end), "memset", 0, 0))
            elif kind == "N":
                names[int(parts[1])] = base_name(parts[2])
    for dev, start, end, name_id, graph, grid in kernels:
        ops[dev].append((start, end, names.get(name_id, "?"), graph, grid))
    for dev in ops:
        ops[dev].sort()
    return ops


def busy_ns(step):
    """Time covered by at least one op (ops on several streams may overlap)."""
    total, cur_start, cur_end = 0, None, None
    for start, end, *_ in step:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def split_steps(ops):
    steps, cur = [], []
    for op in ops:
        if op[2].startswith("Embedding") and cur:
            steps.append(cur)
            cur = []
        cur.append(op)
    if cur:
        steps.append(cur)
    return [s for s in steps if s[0][2].startswith("Embedding")]


def classify(step):
    if step[0][4] <= 64:  # the Embedding's grid: one block per token
        return "decode"
    if any("ScoreKeys" in op[2] for op in step):
        return "prefill-select"
    return "prefill"


def report(dev, steps, kinds, detail):
    by_kind = collections.defaultdict(list)
    for s in steps:
        by_kind[classify(s)].append(s)
    counts = ", ".join(f"{k} {len(v)}" for k, v in sorted(by_kind.items()))
    print(f"## device {dev}: {len(steps)} steps ({counts})")
    for kind in kinds:
        group = by_kind.get(kind, [])
        if kind == "decode":
            group = group[2:]  # the first steps capture graphs and size workspaces
        if not group:
            continue
        spans = [s[-1][1] - s[0][0] for s in group]
        busy = [busy_ns(s) for s in group]
        print(f"\n### {kind}: {len(group)} steps, median {statistics.median(spans) / 1e6:.3f} ms, "
              f"GPU busy {statistics.median(busy) / 1e6:.3f} ms "
              f"({100 * statistics.median(busy) / max(1, statistics.median(spans)):.1f}%)")
        per_name = collections.defaultdict(lambda: [0, 0])
        for s in group:
            for start, end, name, *_ in s:
                per_name[name][0] += 1
                per_name[name][1] += end - start
        print("| op | calls/step | ms/step | us/call |\n|---|---|---|---|")
        for name, (calls, ns) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
            print(f"| {name} | {calls / len(group):.1f} | {ns / len(group) / 1e6:.3f} | "
                  f"{ns / calls / 1e3:.1f} |")
        if detail is not None:
            median_step = sorted(group, key=lambda s: s[-1][1] - s[0][0])[len(group) // 2]
            appends = [i for i, op in enumerate(median_step) if op[2].startswith("KvAppend")]
            if len(appends) > detail + 1:
                lo, hi = appends[detail], appends[detail + 1]
                t0 = median_step[lo][0]
                print(f"\nlayer {detail} of the median step (KvAppend to the next KvAppend):")
                print("| op | start us | us | gap before us |\n|---|---|---|---|")
                prev_end = median_step[lo - 1][1] if lo > 0 else t0
                for start, end, name, graph, _ in median_step[lo:hi + 1]:
                    tag = " (graph)" if graph else ""
                    print(f"| {name}{tag} | {(start - t0) / 1e3:.1f} | {(end - start) / 1e3:.1f} | "
                          f"{(start - prev_end) / 1e3:.1f} |")
                    prev_end = max(prev_end, end)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--device", type=int, default=None, help="one GPU only (default: all)")
    parser.add_argument("--kinds", default="decode,prefill-select,prefill")
    parser.add_argument("--detail", type=int, default=None,
                        help="list every op of this layer of the median step")
    args = parser.parse_args()
    ops = load(args.trace)
    if not ops:
        sys.exit(f"{args.trace}: no records")
    for dev in sorted(ops):
        if args.device is not None and dev != args.device:
            continue
        report(dev, split_steps(ops[dev]), args.kinds.split(","), args.detail)
        print()


if __name__ == "__main__":
    main()
