#!/usr/bin/env python3
"""Checks deploy/grafana and deploy/prometheus against docs/metrics.md (no server needed):

  - each dashboard is importable: valid JSON, title, uid, an integer schemaVersion, a templated
    Prometheus datasource ($datasource) used by every panel and target, unique panel ids, a
    gridPos and at least one non-empty query on every panel that is not a row;
  - the committed dashboard JSON is what deploy/grafana/make_dashboard.py writes;
  - every PromQL expression of the dashboards (targets and template queries) and of the rules
    uses only series of metrics listed in docs/metrics.md, or recording rules defined in
    deploy/prometheus/recording_rules.yml, and every Grafana variable it uses is known;
  - recording rule names follow level:metric:operation; every alert has a severity, a summary
    and a runbook that points at an existing heading of docs/operations.md.
Exit 0 with a summary, or 1 listing every problem.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_exprs as dx  # noqa: E402

errors = []


def check(cond, message):
    if not cond:
        errors.append(message)
    return cond


def check_dashboard(path):
    name = os.path.basename(path)
    try:
        with open(path) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        errors.append(f"{name}: not valid JSON: {e}")
        return []
    check(isinstance(dash.get("schemaVersion"), int), f"{name}: schemaVersion must be an int")
    check(dash.get("title") and dash.get("uid"), f"{name}: needs a title and a uid")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
          f"{name}: needs a templated Prometheus datasource variable named 'datasource'")
    templated = {"type": "prometheus", "uid": "${datasource}"}
    exprs = []
    for var in variables.values():
        if var.get("type") == "query":
            check(var.get("datasource") == templated,
                  f"{name}: variable {var.get('name')} must use $datasource")
            query = var.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            inner = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query or "")
            exprs.append((f"{name}: variable {var.get('name')}", inner))
    ids = set()
    for panel in dx.all_panels(dash):
        title = f"{name}: panel {panel.get('title')!r}"
        check(panel.get("id") not in ids, f"{title}: duplicate id {panel.get('id')}")
        ids.add(panel.get("id"))
        check("gridPos" in panel, f"{title}: no gridPos")
        if panel.get("type") == "row":
            continue
        check(panel.get("datasource") == templated, f"{title}: datasource must be $datasource")
        targets = panel.get("targets") or []
        check(targets and all(t.get("expr", "").strip() for t in targets),
              f"{title}: every panel needs at least one query, and no query may be empty")
        for t in targets:
            check(t.get("datasource") == templated, f"{title}: target datasource not templated")
    return exprs + dx.dashboard_exprs(path)


def main():
    series = dx.doc_series(dx.doc_metrics())
    check(len(series) > 10, "docs/metrics.md: metric table not found")
    rules = dx.rule_exprs()
    recorded = {name for kind, name, _ in rules if kind == "record"}
    for name in recorded:
        check(re.fullmatch(r"tokenselect:[a-z0-9_]+:[a-z0-9_]+", name),
              f"recording rule {name}: use tokenselect:metric:operation")

    exprs = []
    dashboards = dx.dashboard_files()
    check(dashboards, "no dashboard under deploy/grafana/dashboards")
    for path in dashboards:
        exprs += check_dashboard(path)
    exprs += [(f"{kind} {name}", expr) for kind, name, expr in rules]
    for where, expr in exprs:
        try:
            dx.substitute_grafana_vars(expr)
        except KeyError as e:
            errors.append(f"{where}: {e}")
        names = dx.metric_names(expr)
        check(names, f"{where}: no metric found in {expr!r}")
        for metric in sorted(names - series - recorded):
            errors.append(f"{where}: {metric} is neither in docs/metrics.md nor a recording rule")

    with open(os.path.join(dx.REPO, "docs", "operations.md")) as f:
        anchors = {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                   for line in f if line.startswith("#")}
    for path in dx.RULE_FILES[1:]:
        for rule in dx.load_rules(path):
            alert = rule.get("alert", "?")
            annotations = rule.get("annotations", {})
            check(rule.get("labels", {}).get("severity") in ("critical", "warning", "info"),
                  f"alert {alert}: severity must be critical, warning or info")
            check(annotations.get("summary"), f"alert {alert}: no summary")
            runbook = annotations.get("runbook", "")
            check(runbook.startswith("docs/operations.md#")
                  and runbook.split("#", 1)[1] in anchors,
                  f"alert {alert}: runbook {runbook!r} is not a heading of docs/operations.md")

    generator = os.path.join(dx.REPO, "deploy", "grafana", "make_dashboard.py")
    generated = subprocess.run([sys.executable, generator, "--stdout"], capture_output=True,
                               text=True, check=False)
    with open(os.path.join(dx.DASHBOARD_DIR, "tokenselect.json")) as f:
        check(generated.returncode == 0 and generated.stdout == f.read(),
              "deploy/grafana/dashboards/tokenselect.json differs from make_dashboard.py's output:"
              " run deploy/grafana/make_dashboard.py")

    if errors:
        print("\n".join(errors))
        print(f"FAILED: {len(errors)} problem(s)")
        return 1
    print(f"ok: {len(dashboards)} dashboard(s), {len(exprs)} expressions, {len(rules)} rules, "
          f"{len(series)} documented series")
    return 0


if __name__ == "__main__":
    sys.exit(main())
