#!/usr/bin/env python3
"""Black-box test of the monitoring: a real Prometheus scrapes a running server's /metrics and
evaluates every PromQL expression of deploy/grafana/dashboards and deploy/prometheus.

  prometheus_test.py --server BIN [--server-arg ARG]... [--prometheus PATH] [--timeout-s S]
  prometheus_test.py --all-in-one TOKENSELECT [--prometheus PATH] [--timeout-s S]

Steps: start BIN --metrics_port=P (plus the --server-arg values) on loopback and wait until
/healthz answers 200; with --all-in-one, start the real server instead (`TOKENSELECT serve
--all-in-one` on a demo checkpoint generated in a temp dir, router and metrics on free loopback
ports; /healthz turns 200 once the router accepts calls) and keep a short load on it (a few
concurrent `TOKENSELECT generate --server` runs, plus a request the router refuses with
INVALID_ARGUMENT so that the error-ratio rule has a numerator; any other failed run is a problem,
reported with its last output line); start Prometheus with a generated config (scrape every
second, evaluate the rules every second, loading our two rule files); then, until every check
passes or the timeout:
  - every dashboard query and every recording rule returns data (Grafana variables substituted:
    $__rate_interval=15s, $job=.+);
  - every alert expression evaluates without error and every series it names has data (an alert
    that does not fire returns nothing, which is fine);
  - every rule group loaded and every rule's last evaluation succeeded (health "ok").
ctest runs both: the all-in-one server (prometheus_integration_test) and
tests/integration/metrics_fixture (prometheus_fixture_test: simulated traffic that also covers
label values the CPU server does not produce, e.g. the nccl transport).
Exit 0 on success, 1 on failure, 77 (skip) when Prometheus is not installed.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "unit", "deploy"))
import deploy_exprs as dx  # noqa: E402

SKIP = 77
GRAFANA_VARS = {"__rate_interval": "15s", "__interval": "1s", "job": ".+"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def wait_for(url, proc, what, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before serving {url}")
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what}: {url} not ready after {timeout_s}s")


class Prometheus:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            _, body = http_get(url, timeout=10)
        except urllib.error.HTTPError as e:  # 400/422 carry the error as JSON
            body = e.read().decode()
        return json.loads(body)

    def query(self, expr):
        """(error or None, number of series/samples returned)."""
        reply = self.api("query", query=expr)
        if reply.get("status") != "success":
            return f"{reply.get('errorType')}: {reply.get('error')}", 0
        result = reply["data"]["result"]
        return None, len(result) if isinstance(result, list) else 1


def write_config(tmp, metrics_port):
    rule_paths = []
    for path in dx.RULE_FILES:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copy(path, copy)
        rule_paths.append(copy)
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n")
        f.write("rule_files:\n" + "".join(f"  - {p}\n" for p in rule_paths))
        f.write("scrape_configs:\n  - job_name: tokenselect\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    return config


class Load:
    """A few concurrent `tokenselect generate --server` loops until stop()."""

    def __init__(self, tokenselect, port, tmp, concurrency=3):
        self.stop_event = threading.Event()
        self.errors = []
        base = [tokenselect, "generate", "--server", f"127.0.0.1:{port}", "--max_new_tokens", "8",
                "--temperature", "0", "--k", "16", "--n_init", "4", "--n_local", "8"]
        self.bad = base + ["--prompt", "refused", "--top_p", "2"]
        self.log = open(os.path.join(tmp, "load.log"), "w")
        self.threads = [threading.Thread(target=self.loop, args=(base, i), daemon=True)
                        for i in range(concurrency)]
        for thread in self.threads:
            thread.start()

    def loop(self, base, worker):
        n = 0
        while not self.stop_event.is_set():
            words = " ".join(f"word{(worker * 7 + n + i) % 50}" for i in range(40 + 10 * worker))
            cmd = base + ["--prompt", f"Load {worker}.{n}: {words}"]
            if worker == 0 and n % 5 == 0:
                cmd = self.bad  # INVALID_ARGUMENT from the router
            result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    timeout=30, check=False, text=True, errors="replace")
            self.log.write(result.stdout)
            if result.returncode != 0 and cmd is not self.bad:
                last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
                self.errors.append(f"generate exited with {result.returncode}: {last}")
            n += 1

    def stop(self):
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=35)
        self.log.close()


def checks(prom):
    """Every problem right now ([] when all pass) and how many expressions were checked."""
    problems, count = [], 0
    data_exprs = [(where, dx.substitute_grafana_vars(expr, GRAFANA_VARS))
                  for path in dx.dashboard_files() for where, expr in dx.dashboard_exprs(path)]
    data_exprs += [(f"record {name}", expr) for kind, name, expr in dx.rule_exprs()
                   if kind == "record"]
    data_exprs += [(f"recorded series {name}", name) for kind, name, _ in dx.rule_exprs()
                   if kind == "record"]
    for where, expr in data_exprs:
        count += 1
        error, n = prom.query(expr)
        if error or n == 0:
            problems.append(f"{where}: {error or 'no data'}: {expr}")
    for kind, name, expr in dx.rule_exprs():
        if kind != "alert":
            continue
        count += 1
        error, _ = prom.query(expr)
        if error:
            problems.append(f"alert {name}: {error}: {expr}")
        for metric in sorted(dx.metric_names(expr)):
            error, n = prom.query(metric)
            if error or n == 0:
                problems.append(f"alert {name}: series {metric}: {error or 'no data'}")
    groups = prom.api("rules").get("data", {}).get("groups", [])
    if len(groups) != 2:
        problems.append(f"expected 2 rule groups loaded, got {len(groups)}")
    for group in groups:
        for rule in group["rules"]:
            if rule.get("health") != "ok":
                problems.append(f"rule {rule.get('name')}: health {rule.get('health')} "
                                f"{rule.get('lastError', '')}")
    return problems, count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", help="binary taking --metrics_port=N")
    parser.add_argument("--all-in-one", metavar="TOKENSELECT",
                        help="the tokenselect CLI: test `serve --all-in-one` under load")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra argument for the server (repeatable)")
    parser.add_argument("--prometheus", default=shutil.which("prometheus"))
    parser.add_argument("--timeout-s", type=float, default=90)
    args = parser.parse_args()
    if bool(args.server) == bool(args.all_in_one):
        parser.error("give one of --server or --all-in-one")
    if not args.prometheus or not os.path.exists(args.prometheus):
        print("SKIP: prometheus is not installed (Debian package 'prometheus')")
        return SKIP

    procs = []
    load = None
    tmp = tempfile.mkdtemp(prefix="ts-prom-")
    try:
        metrics_port, prom_port = free_port(), free_port()
        if args.all_in_one:
            grpc_port = free_port()
            argv = [args.all_in_one, "serve", "--all-in-one", "--host=127.0.0.1",
                    f"--port={grpc_port}", "--metrics_host=127.0.0.1", f"--cache_dir={tmp}",
                    "--drain_timeout_s=1"]
        else:
            argv = [args.server] + args.server_arg
        server = subprocess.Popen(argv + [f"--metrics_port={metrics_port}"],
                                  stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(tmp, "server.log"), "w"))
        procs.append(server)
        # /healthz answers 200 only once the gRPC port accepts calls: load may start then.
        wait_for(f"http://127.0.0.1:{metrics_port}/healthz", server, "server", 20)
        if args.all_in_one:
            load = Load(args.all_in_one, grpc_port, tmp)
        _, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        if "# TYPE tokenselect_" not in text:
            raise RuntimeError("/metrics serves no tokenselect metric")

        config = write_config(tmp, metrics_port)
        prom = subprocess.Popen(
            [args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
        procs.append(prom)
        wait_for(f"http://127.0.0.1:{prom_port}/-/ready", prom, "prometheus", 20)
        client = Prometheus(prom_port)

        deadline = time.time() + args.timeout_s
        while True:
            problems, count = checks(client)
            if load is not None and load.errors:
                problems.append(f"load: {load.errors[0]} ({len(load.errors)} failed runs)")
            if not problems:
                print(f"ok: {count} expressions return data through Prometheus "
                      f"(server {os.path.basename(args.server or args.all_in_one)}"
                      f"{' serve --all-in-one' if args.all_in_one else ''})")
                return 0
            if time.time() > deadline:
                print("\n".join(problems))
                for log in ("prometheus.log", "server.log", "load.log"):
                    path = os.path.join(tmp, log)
                    if os.path.exists(path):
                        with open(path) as f:
                            sys.stdout.write(f"--- {log}\n{f.read()[-3000:]}")
                print(f"FAILED: {len(problems)} problem(s) after {args.timeout_s}s")
                return 1
            time.sleep(2)
    except RuntimeError as e:
        print(f"FAILED: {e}")
        return 1
    finally:
        if load is not None:
            load.stop()
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
