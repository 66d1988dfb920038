#!/usr/bin/env python3
"""Checks the build graph against the dependency direction of docs/architecture.md.

Reads build_graph.tsv (written by cmake/TsBuildGraph.cmake at configure time): one target per
line with its folder and direct link dependencies. Rules, on the transitive closure:
  - layers point down: common (and proto) < tokenizer, params, rpc < kernels < engine < services
    (router, prefill_worker, decode_worker, wire, clients); nothing links a target of a higher
    layer;
  - common/ and params/ link no CUDA, no NCCL, no gRPC/protobuf;
  - the router links neither engine/ nor kernels/ nor CUDA/NCCL;
  - prefill_worker/ and decode_worker/ never link each other.
Exit 0 with a summary when every rule holds; 1 with every violation listed otherwise.
"""
import sys

LAYER = {"common": 0, "tokenizer": 0.5, "params": 0.5, "kernels": 1, "engine": 2, "prefill_worker": 3, "decode_worker": 3,
         "router": 3, "clients": 3, "wire": 3, "rpc": 0.5, "proto": 0}
CUDA_PREFIXES = ("CUDA::", "ts::nccl")
GRPC_PREFIXES = ("gRPC::", "protobuf::")


def top_folder(folder):
    return folder.split("/")[0] if folder else ""


def main(path):
    targets = {}
    with open(path) as f:
        for line in f:
            name, folder, deps = line.rstrip("\n").split("\t")
            targets[name] = (folder, [d for d in deps.split(",") if d])

    def closure(name, seen=None):
        seen = set() if seen is None else seen
        for dep in targets.get(name, ("", []))[1]:
            # $<LINK_ONLY:x> and other generator expressions wrap a plain name.
            dep = dep.split(":")[-1].rstrip(">") if dep.startswith("$<") else dep
            if dep not in seen:
                seen.add(dep)
                closure(dep, seen)
        return seen

    errors = []
    checked = 0
    for name, (folder, _) in sorted(targets.items()):
        top = top_folder(folder)
        if top not in LAYER:
            continue  # tests, bench and tools may link anything
        checked += 1
        deps = closure(name)
        for dep in deps:
            if dep in targets:
                dep_top = top_folder(targets[dep][0])
                if dep_top in LAYER and LAYER[dep_top] > LAYER[top]:
                    errors.append(f"{name} ({top}) links {dep} ({dep_top}): layers point down")
                if {top, dep_top} == {"prefill_worker", "decode_worker"}:
                    errors.append(f"{name} ({top}) links {dep} ({dep_top}): workers are independent")
                if top == "router" and dep_top in ("engine", "kernels"):
                    errors.append(f"{name} (router) links {dep} ({dep_top})")
            if top in ("common", "params", "router") and dep.startswith(CUDA_PREFIXES):
                errors.append(f"{name} ({top}) links {dep}: no CUDA here")
            if top in ("common", "params") and dep.startswith(GRPC_PREFIXES):
                errors.append(f"{name} ({top}) links {dep}: no gRPC in {top}")
    if errors:
        print("build graph violates the dependency direction:")
        for e in errors:
            print("  " + e)
        return 1
    print(f"build graph OK: {checked} targets in layered folders checked")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
