#!/usr/bin/env python3
"""1M-token runs of a dummy Llama-3-8B (docs/performance.md, "1M-token contexts").

End to end through the engine (`tokenselect generate --device cuda`, Generator over CudaBackend:
chunked prefill with TokenSelect, then greedy decode), one --tokens prompt of random ids, for:
  tp2-bf16   --tp 2 on two GPUs, bf16 KV (64 GiB of KV per GPU at 1M)
  tp1-fp8    one GPU, --kv_dtype fp8 (64 GiB of KV)
TTFT is the generator's prefill time; decode ms/token its mean over the continuation. Then
bench_tp_cuda at the same context for dense next to TokenSelect (a dense prefill of 1M tokens
takes many minutes: the bench writes the context with a streaming prefill and times one dense
512-token chunk and dense decode steps). Jobs on disjoint GPUs run at the same time. Last, the
bandwidth floor of a decode step per GPU = (weight bytes + the KV bytes the policy must read)
/ measured copy bandwidth (torch, device to device, bytes read + written per second).

  long_context_bench.py --bin DIR --work DIR [--tokens 1048576] [--new 32] [--chunk 512]
                        [--jobs tp2-bf16,tp1-fp8] [--phases generate,bench] [--timeout S]
                        [--one_gpu G] [--first_gpu G]
"""
import argparse
import os
import random
import re
import subprocess
import sys
import time

L, H, HKV, D, HIDDEN, INTER, VOCAB = 32, 32, 8, 128, 4096, 14336, 128256


def make_model(cli, out):
    subprocess.run([cli, "make-model", "--preset", "llama3-rope", "--out", out], check=True,
                   capture_output=True)
    path = os.path.join(out, "config.json")
    text = open(path).read()
    for key, value in [("hidden_size", HIDDEN), ("intermediate_size", INTER),
                       ("num_hidden_layers", L), ("num_attention_heads", H),
                       ("num_key_value_heads", HKV), ("head_dim", D), ("vocab_size", VOCAB),
                       ("max_position_embeddings", 2 * 1048576)]:
        text = re.sub(r'"%s": *\d+' % key, '"%s": %d' % (key, value), text)
    open(path, "w").write(text)


def copy_bandwidth(device):
    """Device-to-device copy on GPU `device` (the first GPU of the first job: two invocations on
    disjoint GPUs must not measure on the same one at the same time)."""
    try:
        import torch
        torch.cuda.set_device(device)  # this process only measures; the jobs are children
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:%d" % device)
        y = torch.empty_like(x)
        x_bytes = x.numel()
        for _ in range(3):
            y.copy_(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            t = time.perf_counter()
            y.copy_(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        times.sort()
        del x, y
        torch.cuda.empty_cache()  # this GPU runs a job next
        return 2 * x_bytes / times[len(times) // 2]
    except Exception as e:  # torch missing: no floor column
        print("copy bandwidth not measured: %s" % e, flush=True)
        return None


def weights_per_gpu(tp):
    layer = HIDDEN * (H * D + 2 * HKV * D) + H * D * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN
    return 2.0 * (L * layer / tp + 2 * VOCAB * HIDDEN + HIDDEN)


def kv_read_per_gpu(policy, n, tp, elem):
    row = HKV // tp * D * elem  # one token's K (or V) of one layer on one GPU
    if policy == "dense":
        return L * 2 * n * row
    selected = 128 + 2048 + 512
    return L * (n * row + 2 * selected * row)  # the key scan + the selected K and V


def start(name, gpus, cmd, log):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus)
    print("[%s] GPUs %s: %s" % (name, gpus, " ".join(cmd)), flush=True)
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def command(a, phase, tp, dtype):
    if phase == "generate":
        return [os.path.join(a.bin, "tokenselect"), "generate", "--model",
                os.path.join(a.work, "m8b"), "--load_format", "dummy", "--device", "cuda", "--tp",
                str(tp), "--kv_dtype", dtype, "--max_context", str(a.tokens + a.new + 64),
                "--prompt_ids_file", os.path.join(a.work, "prompt.ids"), "--max_new_tokens",
                str(a.new), "--ignore_eos", "--chunk_size", str(a.chunk)]
    return [os.path.join(a.bin, "bench_tp_cuda"), "--tp", str(tp), "--kv_dtype", dtype,
            "--contexts", str(a.tokens), "--policies", "dense,tokenselect", "--decode",
            str(a.bench_decode), "--chunks", "2"]


def parse(phase, text, tokens, r):
    if phase == "generate":
        m = re.search(r"prefill ([0-9.]+) s", text)
        d = re.search(r"decode ([0-9.]+) ms/token", text)
        r["ttft"] = float(m.group(1)) if m else None
        r["decode"] = float(d.group(1)) if d else None
        return
    for pol in ("dense", "tokenselect"):
        m = re.search(r"\| \d+ \| %d \| %s \| ([0-9.]+) \| ([0-9.]+) \|" % (tokens, pol), text)
        if m:
            r["bench_" + pol] = (float(m.group(1)), float(m.group(2)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tokens", type=int, default=1048576)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--jobs", default="tp2-bf16,tp1-fp8")
    ap.add_argument("--bench_decode", type=int, default=16)
    ap.add_argument("--phases", default="generate,bench",
                    help="generate (end to end, TokenSelect) and/or bench (bench_tp_cuda)")
    ap.add_argument("--one_gpu", default="2", help="the GPU of the one-GPU jobs (tp1-fp8)")
    ap.add_argument("--first_gpu", type=int, default=0,
                    help="added to the GPU numbers of the multi-GPU jobs (two runs side by side "
                    "on a 4-GPU host: 0 and 2)")
    ap.add_argument("--timeout", type=float, default=0,
                    help="seconds a job may run before it is killed (0: no limit)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    make_model(os.path.join(a.bin, "tokenselect"), os.path.join(a.work, "m8b"))
    rng = random.Random(5)
    with open(os.path.join(a.work, "prompt.ids"), "w") as f:
        f.write(",".join(str(rng.randrange(5, 120000)) for _ in range(a.tokens)))
    gpus = lambda n: ",".join(str(a.first_gpu + i) for i in range(n))
    jobs = {  # name: (GPUs, tp, kv dtype)
        "tp2-bf16": (gpus(2), 2, "bf16"),
        "tp1-fp8": (a.one_gpu, 1, "fp8"),
        "tp4-bf16": (gpus(4), 4, "bf16"),
        "tp2-fp8": (gpus(2), 2, "fp8"),
    }
    wanted = [j for j in a.jobs.split(",") if j]
    bw = copy_bandwidth(int(jobs[wanted[0]][0].split(",")[0]) if wanted else 0)
    # Phase 1: end to end, TokenSelect. Phase 2: bench_tp_cuda dense + TokenSelect.
    results = {}
    for phase in [p for p in ("generate", "bench") if p in a.phases.split(",")]:
        pending = list(wanted)
        while pending:  # rounds: the jobs of one round use disjoint GPUs and run together
            procs = []
            used = set()
            for name in list(pending):
                gpus, tp, dtype = jobs[name]
                if used & set(gpus.split(",")):
                    continue  # overlapping GPUs: the next round
                pending.remove(name)
                log = os.path.join(a.out, "%s_%s.log" % (phase, name))
                procs.append((name, log, start(name, gpus, command(a, phase, tp, dtype), log)))
                used |= set(gpus.split(","))
            began = time.time()
            for name, log, p in procs:
                left = None if a.timeout <= 0 else max(1, a.timeout - (time.time() - began))
                try:
                    p.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    print("[%s %s] killed after %.0f s (--timeout)" % (phase, name, a.timeout),
                          flush=True)
                text = open(log).read()
                print("[%s %s] rc=%d\n%s" % (phase, name, p.returncode, text[-1500:]), flush=True)
                parse(phase, text, a.tokens, results.setdefault(name, {}))
    print("\n| run | GPUs | KV | TTFT (s), tokenselect | decode ms/token, tokenselect (engine) | "
          "decode ms/token tokenselect / dense (bench) | chunk-512 ms tokenselect / dense | "
          "floor ms tokenselect / dense |")
    print("|---|---|---|---|---|---|---|---|")
    for name in wanted:
        gpus, tp, dtype = jobs[name]
        r = results.get(name, {})
        elem = 1 if dtype == "fp8" else 2
        floors = "-"
        if bw:
            f = [(weights_per_gpu(tp) + kv_read_per_gpu(p, a.tokens, tp, elem)) / bw * 1e3
                 for p in ("tokenselect", "dense")]
            floors = "%.2f / %.2f" % tuple(f)
        ts, de = r.get("bench_tokenselect"), r.get("bench_dense")
        fmt = lambda v: "-" if v is None else "%.2f" % v
        print("| %s | %d | %s | %s | %s | %s / %s | %s / %s | %s |" % (
            name, tp, dtype, fmt(r.get("ttft")), fmt(r.get("decode")),
            fmt(ts[1] if ts else None), fmt(de[1] if de else None),
            fmt(ts[0] if ts else None), fmt(de[0] if de else None), floors))
    if bw:
        print("copy bandwidth %.0f GB/s (read + write)" % (bw / 1e9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
