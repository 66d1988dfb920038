#!/usr/bin/env python3
"""Checks that the Helm chart and the Docker image start the binaries the repository builds with
flags those binaries define:

  check_chart_flags.py --router BIN --prefill_worker BIN --decode_worker BIN

  - values.yaml's router/prefill/decode `command` name the binaries (router, prefill_worker,
    decode_worker), and deploy/docker/Dockerfile ships each of them;
  - every flag of the ConfigMap's flag files (templates/configmap.yaml: common.flags for every
    process, router.flags, worker.flags for both workers, prefill.flags, decode.flags), every
    `- --flag` of the container args (templates/router.yaml, templates/workers.yaml) and every
    extraArgs flag of values.yaml appears in the `--helpfull` output of each binary that reads it;
  - every --flagfile the templates pass names a flag file of the ConfigMap.
Flags are read from the templates without rendering them (helm is not packaged for Debian 12):
a line `--name=...` or `--name` inside a flag file, whatever {{ if }} block it is in, so that the
TLS flags are checked too. Exit 0 with a summary, or 1 listing every problem.
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CHART = os.path.join(REPO, "deploy", "helm", "tokenselect")
DOCKERFILE = os.path.join(REPO, "deploy", "docker", "Dockerfile")
BINARIES = ("router", "prefill_worker", "decode_worker")
# Which binaries read each flag file of the ConfigMap.
READERS = {
    "common.flags": BINARIES,
    "router.flags": ("router",),
    "worker.flags": ("prefill_worker", "decode_worker"),
    "prefill.flags": ("prefill_worker",),
    "decode.flags": ("decode_worker",),
}
FLAG = re.compile(r"^\s*(?:-\s+)?--([A-Za-z_][A-Za-z0-9_]*)")


def read(path):
    with open(path) as f:
        return f.read()


def configmap_flags():
    """{flag file name: [flag names]} from templates/configmap.yaml's data."""
    files, current = {}, None
    for line in read(os.path.join(CHART, "templates", "configmap.yaml")).splitlines():
        header = re.match(r"^  ([A-Za-z0-9_.-]+):\s*\|", line)
        if header:
            current = header.group(1)
            files[current] = []
            continue
        if current and line.startswith("    "):
            match = FLAG.match(line)
            if match:
                files[current].append(match.group(1))
        elif line.strip() and not line.startswith("    "):
            current = None
    return files


def template_args(name):
    """(flags, flagfile paths) of the `- --flag` lines of a template's args."""
    flags, flagfiles = [], []
    for line in read(os.path.join(CHART, "templates", name)).splitlines():
        match = re.match(r"^\s*-\s+--([A-Za-z_][A-Za-z0-9_]*)(?:=(.+))?", line)
        if not match:
            continue
        if match.group(1) == "flagfile":
            flagfiles.append(match.group(2) or "")
        else:
            flags.append(match.group(1))
    return flags, flagfiles


def helpfull_flags(binary):
    result = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=60,
                            check=False)
    text = result.stdout + result.stderr
    return set(re.findall(r"^\s+--([A-Za-z_][A-Za-z0-9_]*)", text, re.MULTILINE))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in BINARIES:
        parser.add_argument(f"--{name}", required=True, help=f"the {name} binary")
    args = parser.parse_args()
    errors = []
    known = {}
    for name in BINARIES:
        known[name] = helpfull_flags(getattr(args, name))
        if "model" not in known[name]:
            errors.append(f"{name} --helpfull lists no --model: is it the right binary?")

    values = yaml.safe_load(read(os.path.join(CHART, "values.yaml")))
    dockerfile = read(DOCKERFILE)
    for role, binary in (("router", "router"), ("prefill", "prefill_worker"),
                         ("decode", "decode_worker")):
        command = values[role]["command"]
        if os.path.basename(command[0]) != binary:
            errors.append(f"values.yaml: {role}.command {command} does not run {binary}")
        if not re.search(rf"/build/bin/{binary}\b", dockerfile):
            errors.append(f"deploy/docker/Dockerfile does not ship {binary}")
        for arg in values[role].get("extraArgs") or []:
            match = FLAG.match(arg)
            if match and match.group(1) not in known[binary]:
                errors.append(f"values.yaml: {role}.extraArgs: {binary} has no --{match.group(1)}")

    files = configmap_flags()
    checked = 0
    for file_name, flags in files.items():
        readers = READERS.get(file_name)
        if readers is None:
            errors.append(f"configmap.yaml: flag file {file_name} is read by no known binary")
            continue
        for flag in flags:
            checked += 1
            for binary in readers:
                if flag not in known[binary]:
                    errors.append(f"configmap.yaml {file_name}: {binary} has no --{flag}")
    for template, readers in (("router.yaml", ("router",)),
                              ("workers.yaml", ("prefill_worker", "decode_worker"))):
        flags, flagfiles = template_args(template)
        for flag in flags:
            checked += 1
            for binary in readers:
                if flag not in known[binary]:
                    errors.append(f"{template} args: {binary} has no --{flag}")
        for path in flagfiles:
            name = os.path.basename(path)
            names = ([name.replace("{{ $role }}", r) for r in ("prefill", "decode")]
                     if "{{" in name else [name])
            for n in names:
                if n not in files:
                    errors.append(f"{template}: --flagfile={path}: no {n} in the ConfigMap")
    if errors:
        print("\n".join(errors))
        print(f"FAILED: {len(errors)} problem(s)")
        return 1
    print(f"ok: {checked} chart flags exist in {', '.join(BINARIES)}; Dockerfile ships them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
