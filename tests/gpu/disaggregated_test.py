#!/usr/bin/env python3
"""Disaggregated serving on two GPUs (label gpu; docs/kv_transfer.md, "NCCL transport").

Runs the real binaries: a prefill worker on GPU 0 and a decode worker on GPU 1, separate
processes, K/V moved over NCCL (--transport nccl), behind the router; and the all-in-one server
on GPU 0 alone. Checks, on a generated checkpoint (make-model llama3-rope, context raised to
256K):
  1. greedy 32-token continuations of prompts up to --long tokens are identical to all-in-one;
  2. a request aborted mid-transfer (client deadline) and a prefill process killed (SIGKILL)
     mid-transfer leave the decode worker's KV usage at its baseline (0) once the lease ends, and
     the decode worker serves the next request (after the prefill worker restarts) correctly.
With --bench: TTFT of one --bench_tokens prompt on a dummy Llama-3-8B, disaggregated (NCCL)
against the same prefill on one GPU with no transfer (`tokenselect generate --device cuda`) and
against all-in-one (host transport), printed as a table.

With --prefill_tp / --decode_tp the workers run tensor parallel (prefill on GPUs 0 .. P-1, decode
on P .. P+D-1) and the K/V goes through the host transport (every KV head in the wire rows,
sliced per rank on both sides). --tp_invariant S gives the all-in-one server and both workers
TP-invariant numerics (docs/parallel.md): then every continuation must match all-in-one.
--kv_dtype fp8 gives the all-in-one server and both workers an FP8 (e4m3) KV cache: the K/V
then moves between the workers as raw e4m3 bytes, and every continuation must still match
all-in-one's (the same kernels on the same K/V bytes). --policy P makes P the default selection
policy of the all-in-one server and both workers (--selection_policy): infllm checks that its
per-layer state (the received attention) travels with the K/V to the decode worker.

usage: disaggregated_test.py --bin DIR --work DIR [--long N] [--bench] [--bench_tokens N]
                             [--prefill_tp P] [--decode_tp D] [--transport host|nccl]
                             [--tp_invariant S] [--kv_dtype bf16|fp8] [--policy P]
Exit status 0 when every check holds; the log lines say what was measured.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request

FAILURES = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


LOGS = []


class Proc:
    """A server process with its log file (one per start: <n>_<name>.log)."""

    def __init__(self, name, argv, work, env=None):
        self.name = name
        self.path = os.path.join(work, "%02d_%s.log" % (len(LOGS), name))
        LOGS.append(self.path)
        self.log = open(self.path, "w")
        print("start %s: %s" % (name, " ".join(argv)), flush=True)
        self.p = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                  env=env or os.environ.copy())

    def kill(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def metric(port, name):
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read()
    except Exception:  # noqa: BLE001 - not up yet
        return None
    total = None
    for line in text.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total = (total or 0.0) + float(line.split()[-1])
    return total


def wait_for(pred, seconds, step=0.05):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


class Client:
    def __init__(self, cli, work):
        self.cli = cli
        self.work = work

    def generate(self, port, ids, max_new=32, timeout_s=0, background=False):
        flagfile = os.path.join(self.work, "prompt_%d_%d.flags" % (len(ids), random.randrange(1 << 30)))
        with open(flagfile, "w") as f:
            f.write("--prompt_ids=%s\n" % ",".join(map(str, ids)))
        argv = [self.cli, "generate", "--server", "127.0.0.1:%d" % port, "--flagfile=" + flagfile,
                "--max_new_tokens=%d" % max_new, "--ignore_eos", "--print_ids"]
        if timeout_s:
            argv.append("--timeout_s=%g" % timeout_s)
        if background:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The router marks a worker healthy at its next probe: retry while it has none yet.
        end = time.time() + 15
        while True:
            r = parse(subprocess.run(argv, capture_output=True, text=True, timeout=240))
            if "no healthy" not in r["err"] or time.time() > end:
                return r
            time.sleep(0.3)


def parse(r):
    ids = re.search(r"^ids: (.*)$", r.stdout, re.M)
    ttft = re.search(r"ttft ([0-9.]+) s", r.stderr)
    return {"rc": r.returncode, "ids": ids.group(1) if ids else None,
            "ttft": float(ttft.group(1)) if ttft else None, "err": r.stderr.strip()[-400:]}


def wait_serving(cli, ports, seconds=180):
    """Waits until every port answers grpc.health as SERVING."""
    if isinstance(ports, int):
        ports = [ports]
    return all(wait_for(lambda p=p: subprocess.run([cli, "health", "--server", "127.0.0.1:%d" % p],
                                                   capture_output=True).returncode == 0,
                        seconds, 0.5) for p in ports)


def make_model(cli, out, big=False):
    subprocess.run([cli, "make-model", "--preset", "llama3-rope", "--out", out], check=True,
                   capture_output=True)
    path = os.path.join(out, "config.json")
    text = open(path).read()
    text = re.sub(r'"max_position_embeddings": *\d+', '"max_position_embeddings": 262144', text)
    if big:  # Llama-3-8B's shape (weights come from --load_format dummy)
        for key, value in [("hidden_size", 4096), ("intermediate_size", 14336),
                           ("num_hidden_layers", 32), ("num_attention_heads", 32),
                           ("num_key_value_heads", 8), ("head_dim", 128), ("vocab_size", 128256)]:
            text = re.sub(r'"%s": *\d+' % key, '"%s": %d' % (key, value), text)
    open(path, "w").write(text)


class Cluster:
    """router + prefill worker (GPU 0, NCCL) + decode worker (GPU 1)."""

    def __init__(self, a, model, work, extra=(), lease_ms=4000):
        self.a, self.model, self.work, self.extra = a, model, work, list(extra)
        self.transport = a.transport or ("nccl" if a.device == "cuda" else "host")
        self.ports = {"router": 56101, "prefill": 56102, "decode": 56103, "dmetrics": 56104,
                      "pmetrics": 56105}
        b = a.bin
        self.decode = Proc("decode", [b + "/decode_worker", "--model", model, "--device", a.device,
                                      "--gpu", str(a.decode_gpu) if a.device == "cuda" else "0",
                                      "--tp", str(a.decode_tp), "--port", str(self.ports["decode"]),
                                      "--metrics_port", str(self.ports["dmetrics"]),
                                      "--lease_timeout_ms", str(lease_ms), "--kv_link_timeout_ms",
                                      "5000"] + self.extra, work)
        self.start_prefill()
        self.router = Proc("router", [b + "/router", "--model", model, "--port",
                                      str(self.ports["router"]), "--prefill_workers",
                                      "127.0.0.1:%d" % self.ports["prefill"], "--decode_workers",
                                      "127.0.0.1:%d" % self.ports["decode"],
                                      "--probe_interval_s", "0.2"], work)

    def start_prefill(self):
        self.prefill = Proc("prefill", [self.a.bin + "/prefill_worker", "--model", self.model,
                                        "--device", self.a.device, "--gpu", "0", "--tp",
                                        str(self.a.prefill_tp), "--transport", self.transport,
                                        "--port", str(self.ports["prefill"]), "--metrics_port",
                                        str(self.ports["pmetrics"]), "--kv_link_timeout_ms",
                                        "5000"] + self.extra, self.work)

    def worker_ports(self):
        return [self.ports["decode"], self.ports["prefill"], self.ports["router"]]

    def usage(self):
        return metric(self.ports["dmetrics"], "tokenselect_kv_cache_usage_ratio")

    def stop(self):
        for p in (self.router, self.prefill, self.decode):
            p.kill()


def correctness(a, cli, client):
    model = os.path.join(a.work, "m")
    make_model(cli, model)
    rng = random.Random(7)
    lengths = [5, 77, 513, 1500, 4096, 20000, 65536, a.long]
    prompts = [[rng.randrange(5, 2000) for _ in range(n)] for n in lengths if n <= a.long]
    kv = ["--kv_pages", "20480"]  # 327680 token slots per worker

    if a.tp_invariant:
        kv += ["--tp_invariant", str(a.tp_invariant)]
    if a.kv_dtype != "bf16":
        kv += ["--kv_dtype", a.kv_dtype]
    if a.policy:
        kv += ["--selection_policy", a.policy]
    aio = Proc("all_in_one", [cli, "serve", "--all-in-one", "--model", model, "--device", a.device,
                              "--gpu", "0", "--port", "56001"] + kv, a.work)
    check(wait_serving(cli, 56001), "all-in-one server up")
    reference = [client.generate(56001, p) for p in prompts]
    aio.kill()
    for p, r in zip(prompts, reference):
        check(r["rc"] == 0 and r["ids"], "all-in-one %d-token prompt: %s" % (len(p), r["err"][-200:] if r["rc"] else "ok"))

    c = Cluster(a, model, a.work, kv)
    check(wait_serving(cli, c.worker_ports()), "disaggregated cluster up")
    same = 0
    long_ttft = 1.0
    for p, ref in zip(prompts, reference):
        r = client.generate(c.ports["router"], p)
        long_ttft = r["ttft"] or long_ttft
        ok = r["rc"] == 0 and r["ids"] == ref["ids"]
        same += ok
        print("prompt %7d tokens: all-in-one ttft %s s, disaggregated ttft %s s, identical %s%s" %
              (len(p), ref["ttft"], r["ttft"], ok, "" if r["rc"] == 0 else " (" + r["err"] + ")"),
              flush=True)
    # Tensor parallelism sums in another order than one GPU (bf16 roundings), so a sharded
    # worker may differ from all-in-one on a rare prompt; one GPU each must match exactly.
    one_gpu_each = a.prefill_tp == 1 and a.decode_tp == 1
    need = len(prompts) if one_gpu_each or a.tp_invariant else len(prompts) - 1
    check(same >= need, "identical greedy continuations on %d of %d prompts (prefill TP=%d, "
          "decode TP=%d; %d needed)" % (same, len(prompts), a.prefill_tp, a.decode_tp, need))
    xfer = metric(c.ports["pmetrics"], 'tokenselect_kv_transfer_bytes_total{transport="%s"}' % c.transport)
    print("prefill worker: %.3g GB of K/V sent over %s" % ((xfer or 0) / 1e9, c.transport),
          flush=True)
    check((xfer or 0) > 0, "K/V went over the %s transport" % c.transport)
    check(wait_for(lambda: c.usage() == 0.0, 5), "decode KV usage back to 0 after the requests")

    long_prompt = prompts[-1]
    # Abort mid-transfer: the client's deadline (40% of the prompt's TTFT) ends the request
    # during its prefill and transfer.
    deadline = max(0.05, 0.4 * long_ttft)
    r = client.generate(c.ports["router"], long_prompt, timeout_s=deadline)
    check(r["rc"] != 0, "request with a %.2f s deadline fails (%s)" % (deadline, r["err"][-120:]))
    check(wait_for(lambda: c.usage() == 0.0, 10), "decode KV usage back to 0 after the abort")
    r = client.generate(c.ports["router"], prompts[2])
    check(r["ids"] == reference[2]["ids"], "decode worker serves correctly after the abort")

    # Kill the prefill process mid-transfer.
    bg = client.generate(c.ports["router"], long_prompt, background=True)
    sent = lambda: (metric(c.ports["pmetrics"],
                           'tokenselect_kv_transfer_bytes_total{transport="%s"}' % c.transport) or 0)
    before = sent()
    moving = wait_for(lambda: sent() > before and (c.usage() or 0) > 0, 60, 0.02)
    check(moving, "long request's K/V transfer under way")
    c.prefill.kill(signal.SIGKILL)
    killed_at = time.time()
    out, err = bg.communicate(timeout=120)
    print("client after the kill: rc %d, %s" % (bg.returncode, err.strip()[-200:]), flush=True)
    back = wait_for(lambda: c.usage() == 0.0, 30)
    check(back, "decode KV usage back to 0 after the prefill kill (%.1f s after the kill)" %
          (time.time() - killed_at))
    c.start_prefill()
    ok = wait_serving(cli, [c.ports["prefill"]], 120) and wait_for(
        lambda: client.generate(c.ports["router"], prompts[1])["rc"] == 0, 30, 0.5)
    r = client.generate(c.ports["router"], prompts[3])
    check(ok and r["ids"] == reference[3]["ids"],
          "decode worker serves correctly with a restarted prefill worker (new NCCL link)")
    c.stop()


def bench(a, cli, client):
    model = os.path.join(a.work, "m8b")
    make_model(cli, model, big=True)
    rng = random.Random(11)
    prompt = [rng.randrange(5, 2000) for _ in range(a.bench_tokens)]
    kv = ["--load_format", "dummy", "--kv_pages", str((a.bench_tokens + 4096) // 16)]
    # 1. The same prefill in one process on one GPU, no transfer.
    flagfile = os.path.join(a.work, "bench.flags")
    open(flagfile, "w").write("--prompt_ids=%s\n" % ",".join(map(str, prompt)))
    local = subprocess.run([cli, "generate", "--model", model, "--load_format", "dummy",
                            "--device", "cuda", "--max_context", str(a.bench_tokens + 64),
                            "--flagfile=" + flagfile, "--max_new_tokens", "2", "--ignore_eos"],
                           capture_output=True, text=True, timeout=300)
    m = re.search(r"prefill ([0-9.]+) s", local.stderr)
    local_ttft = float(m.group(1)) if m else None
    print("local generate: %s" % local.stderr.strip()[-300:], flush=True)
    # 2. Disaggregated over NCCL (TTFT as the client sees it, through the router).
    c = Cluster(a, model, a.work, kv, lease_ms=60000)
    up = wait_serving(cli, c.worker_ports(), 240)
    runs = [client.generate(c.ports["router"], prompt, max_new=2) for _ in range(2)] if up else []
    c.stop()
    disagg = [r["ttft"] for r in runs if r["rc"] == 0]
    print("rows: bench_tokens=%d" % a.bench_tokens)
    print("| path | TTFT s |")
    print("|---|---|")
    print("| one GPU, no transfer (generate --device cuda, prefill time) | %s |" % local_ttft)
    for i, t in enumerate(disagg):
        print("| disaggregated, NCCL (run %d, through the router) | %.3f |" % (i + 1, t))
    if local_ttft and disagg:
        print("TTFT overhead of disaggregation (best run): %.1f%%" %
              (100.0 * (min(disagg) / local_ttft - 1)))
    check(bool(disagg), "disaggregated 8B-shape prompt of %d tokens completes (%s)" %
          (a.bench_tokens, [r["err"][-200:] for r in runs if r["rc"] != 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--long", type=int, default=131072)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--skip_correctness", action="store_true")
    ap.add_argument("--bench_tokens", type=int, default=131072)
    ap.add_argument("--device", default="cuda", help="cuda (2 GPUs, NCCL) or cpu (host transport: "
                    "checks the script itself)")
    ap.add_argument("--prefill_tp", type=int, default=1,
                    help="prefill worker's --tp (GPUs 0 .. N-1); the decode worker follows")
    ap.add_argument("--decode_tp", type=int, default=1, help="decode worker's --tp")
    ap.add_argument("--tp_invariant", type=int, default=0,
                    help="--tp_invariant of the all-in-one server and both workers (0: off); "
                         "then every continuation must be identical whatever the TP sizes")
    ap.add_argument("--kv_dtype", default="bf16",
                    help="--kv_dtype of the all-in-one server and both workers (bf16 or fp8: "
                         "e4m3 K/V, moved between the workers as raw bytes)")
    ap.add_argument("--policy", default="",
                    help="--selection_policy of the all-in-one server and both workers (default: "
                         "theirs, tokenselect)")
    ap.add_argument("--decode_gpu", type=int, default=-1,
                    help="decode worker's first GPU (default: right after the prefill worker's)")
    ap.add_argument("--transport", default="",
                    help="host or nccl (default: nccl on cuda, host on cpu; --tp > 1: host)")
    a = ap.parse_args()
    if a.prefill_tp > 1 or a.decode_tp > 1:
        a.transport = a.transport or "host"
    if a.decode_gpu < 0:
        a.decode_gpu = a.prefill_tp
    os.makedirs(a.work, exist_ok=True)
    cli = os.path.join(a.bin, "tokenselect")
    client = Client(cli, a.work)
    phases = ([] if a.skip_correctness else [correctness]) + ([bench] if a.bench else [])
    for phase in phases:
        try:
            phase(a, cli, client)
        except Exception as e:  # noqa: BLE001 - report and go on to the next phase
            check(False, "%s raised %r" % (phase.__name__, e))
        finally:
            subprocess.run(["pkill", "-f", "decode_worker|prefill_worker|/router|tokenselect serve"])
    if FAILURES:
        for path in LOGS:
            print("---- %s (last lines)" % path)
            print("".join(open(path).readlines()[-12:]))
    print("FAILURES: %d" % len(FAILURES))
    for f in FAILURES:
        print("  " + f)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
