#!/usr/bin/env python3
"""Checks deploy/helm/tokenselect:

  - Chart.yaml names the chart and versions it (apiVersion v2);
  - values.schema.json is a valid draft-07 schema and values.yaml satisfies it, while typical
    mistakes (bad transport, theta > 1, unknown key, hostPath volume without a path, TLS without a
    secret, ...) fail;
  - the templates are consistent without rendering them: every .Values path they use exists in
    values.yaml, every included template is defined, and {{ }} / block keywords balance;
  - when `helm` is on PATH: `helm lint` and `helm template` (defaults, and with the
    ServiceMonitor and host transport) succeed; otherwise a message says they were skipped
    (helm is not packaged for Debian 12).
Exit 0 with a summary, or 1 listing every problem.
"""
import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CHART = os.path.join(REPO, "deploy", "helm", "tokenselect")
errors = []


def check(cond, message):
    if not cond:
        errors.append(message)
    return cond


def mutated(values, path, value):
    """A copy of `values` with the dotted `path` set to `value` (None deletes it)."""
    out = copy.deepcopy(values)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def check_values():
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)
    with open(os.path.join(CHART, "values.yaml")) as f:
        values = yaml.safe_load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    for error in validator.iter_errors(values):
        errors.append(f"values.yaml: {'.'.join(map(str, error.path))}: {error.message}")
    bad = [
        ("transport", "tcp"),
        ("device", "tpu"),
        ("selection.theta", 1.5),
        ("selection.policy", "magic"),
        ("selection.k", 0),
        ("decode.kvPages", 0),
        ("kvCache.pageSize", 0),
        ("tls", {"enabled": True}),
        ("router.replicas", 0),
        ("ports.metrics", 70000),
        ("image.repository", None),
        ("model.volume", {"type": "hostPath"}),
        ("model.volume", {"type": "persistentVolumeClaim", "claimName": ""}),
        ("serviceMonitor.interval", "15 seconds"),
        ("unknownKey", True),
    ]
    for path, value in bad:
        check(not validator.is_valid(mutated(values, path, value)),
              f"values.schema.json accepts {path}={value!r}")
    good = mutated(values, "model.volume", {"type": "hostPath", "hostPath": "/data/models"})
    good = mutated(good, "tls", {"enabled": True, "secretName": "tokenselect-tls"})
    check(validator.is_valid(good), "values.schema.json refuses a valid hostPath/TLS setup")
    return values


def has_path(values, dotted):
    node = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def check_templates(values):
    templates = sorted(glob.glob(os.path.join(CHART, "templates", "*")))
    defined = set()
    for path in templates:
        with open(path) as f:
            defined.update(re.findall(r'define\s+"([^"]+)"', f.read()))
    for path in templates:
        name = os.path.basename(path)
        with open(path) as f:
            text = f.read()
        check(text.count("{{") == text.count("}}"), f"{name}: unbalanced {{{{ }}}}")
        actions = re.findall(r"\{\{-?\s*(\w+)", text)
        opened = sum(a in ("if", "range", "with", "define") for a in actions)
        check(opened == actions.count("end"), f"{name}: {opened} blocks but "
              f"{actions.count('end')} ends")
        for used in re.findall(r"\.Values\.([A-Za-z_][\w.]*)", text):
            check(has_path(values, used.rstrip(".")), f"{name}: .Values.{used} is not in values.yaml")
        for included in re.findall(r'include\s+"([^"]+)"', text):
            check(included in defined, f"{name}: template {included!r} is not defined")
    return len(templates)


def run_helm():
    helm = shutil.which("helm")
    if not helm:
        print("SKIP helm lint / helm template: helm is not on PATH (not packaged for Debian 12)")
        return
    runs = [
        [helm, "lint", CHART, "--strict"],
        [helm, "template", "tokenselect", CHART, "--namespace", "tokenselect"],
        [helm, "template", "t", CHART, "--set", "serviceMonitor.enabled=true",
         "--set", "decode.gpusPerPod=0", "--set", "prefill.gpusPerPod=0"],
        [helm, "template", "t", CHART, "--set", "tls.enabled=true", "--set",
         "tls.secretName=tokenselect-tls"],
    ]
    for cmd in runs:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        check(result.returncode == 0, f"{' '.join(cmd[1:3])} failed:\n{result.stdout}{result.stderr}")
        if cmd[1] == "template" and result.returncode == 0:
            docs = [d for d in yaml.safe_load_all(result.stdout) if d]
            kinds = sorted({d["kind"] for d in docs})
            for kind in ("ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "StatefulSet"):
                check(kind in kinds, f"helm template renders no {kind} (got {kinds})")
    bad = [helm, "template", "t", CHART, "--set", "decode.replicas=0"]
    result = subprocess.run(bad, capture_output=True, text=True, check=False)
    check(result.returncode != 0, "helm template accepts decode.replicas=0")
    print("helm lint and helm template ran")


def main():
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    check(chart.get("apiVersion") == "v2" and chart.get("name") == "tokenselect"
          and chart.get("version") and chart.get("appVersion"),
          "Chart.yaml: needs apiVersion v2, name tokenselect, version and appVersion")
    values = check_values()
    count = check_templates(values)
    run_helm()
    if errors:
        print("\n".join(errors))
        print(f"FAILED: {len(errors)} problem(s)")
        return 1
    print(f"ok: chart {chart['name']} {chart['version']}, values valid, {count} templates consistent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
