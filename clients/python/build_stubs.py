#!/usr/bin/env python3
"""Generates the Python protobuf + gRPC stubs of proto/tokenselect/v1 into OUT_DIR.

Used by the CMake target ts_python_client_stubs (into the build tree), by setup.py when the
package is built, and lazily by the package itself. Generated code is never committed.

Prefers the system protoc + grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc): the
protos use proto3 `optional`, which the protoc bundled with older grpc_tools (Debian 12's
python3-grpc-tools ships protoc 3.5) cannot compile. Falls back to `python3 -m grpc_tools.protoc`.

usage: build_stubs.py --out OUT_DIR [--repo REPO_ROOT]
"""
import argparse
import os
import shutil
import subprocess
import sys

PROTOS = ["proto/tokenselect/v1/generate.proto", "proto/tokenselect/v1/worker.proto"]


def default_repo():
    return os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def build(out_dir, repo=None):
    repo = repo or default_repo()
    os.makedirs(out_dir, exist_ok=True)
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc and plugin:
        cmd = [protoc, f"--plugin=protoc-gen-grpc_python={plugin}",
               f"--grpc_python_out={out_dir}"]
    else:
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"--grpc_python_out={out_dir}"]
    cmd += [f"--proto_path={repo}", f"--python_out={out_dir}"] + PROTOS
    subprocess.run(cmd, check=True, cwd=repo)
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repo", default=None)
    args = parser.parse_args()
    build(args.out, args.repo)


if __name__ == "__main__":
    main()
