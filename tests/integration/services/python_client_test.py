#!/usr/bin/env python3
"""Streams one request end to end through the Python client (clients/python) against
`tokenselect serve --all-in-one` on loopback, and checks it against offline generation."""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenselect", required=True)
    parser.add_argument("--python_path", required=True)
    args = parser.parse_args()
    for path in reversed(args.python_path.split(":")):
        sys.path.insert(0, path)
    from tokenselect_client import Client, TokenSelectError

    tmp = tempfile.mkdtemp(prefix="ts-python-")
    model = os.path.join(tmp, "model")
    subprocess.run([args.tokenselect, "make-model", "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    port = free_port()
    log = open(os.path.join(tmp, "serve.log"), "w")
    server = subprocess.Popen([args.tokenselect, "serve", "--all-in-one", "--model", model,
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    ok = False
    try:
        prompt = "The Python client streams"
        with Client(f"127.0.0.1:{port}") as client:
            deadline = time.time() + 60
            while True:
                try:
                    client.model_info(timeout=2)
                    break
                except TokenSelectError:
                    if time.time() > deadline or server.poll() is not None:
                        raise
                    time.sleep(0.2)
            chunks = list(client.generate(prompt, max_new_tokens=10, temperature=0.0,
                                          timeout=60))
        assert chunks, "no chunks"
        assert chunks[-1].finish_reason in ("stop", "length"), chunks[-1]
        ids = [i for c in chunks for i in c.token_ids]
        assert chunks[-1].completion_tokens == len(ids), (chunks[-1], len(ids))
        offline = subprocess.run(
            [args.tokenselect, "generate", "--model", model, "--prompt", prompt,
             "--max_new_tokens", "10", "--temperature", "0", "--print_ids"],
            check=True, capture_output=True, text=True).stdout
        expected = [int(x) for x in offline.rsplit("ids: ", 1)[1].split()[0].split(",") if x]
        assert ids == expected, (ids, expected)
        print(f"python client OK: {len(chunks)} chunks, ids {ids}")
        ok = True
        return 0
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"logs in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
