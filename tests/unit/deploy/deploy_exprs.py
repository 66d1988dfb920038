"""Shared helpers for the deploy/ checks: read docs/metrics.md, the Grafana dashboards and the
Prometheus rule files, list their PromQL expressions and the metric names those use.

Used by check_dashboards.py (unit) and tests/integration/prometheus_test.py (integration).
"""
import glob
import json
import os
import re

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DASHBOARD_DIR = os.path.join(REPO, "deploy", "grafana", "dashboards")
RULE_FILES = [os.path.join(REPO, "deploy", "prometheus", name)
              for name in ("recording_rules.yml", "alert_rules.yml")]
METRICS_DOC = os.path.join(REPO, "docs", "metrics.md")

# Grafana's template variables, replaced by something Prometheus understands when an expression
# is evaluated outside Grafana.
GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "job": ".+"}

# PromQL words that look like identifiers but are not metric names.
PROMQL_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def doc_metrics(path=METRICS_DOC):
    """{name: type} from the metric table of docs/metrics.md."""
    metrics = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("| `tokenselect_"):
                continue
            cells = [c.strip() for c in line.split("|")]
            metrics[cells[1].strip("`")] = cells[2]
    return metrics


def doc_series(metrics):
    """Every series name the documented metrics expose (histograms expose three)."""
    series = set()
    for name, kind in metrics.items():
        if kind == "histogram":
            series.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
        else:
            series.add(name)
    return series


def dashboard_files():
    return sorted(glob.glob(os.path.join(DASHBOARD_DIR, "*.json")))


def all_panels(dashboard):
    """Panels in order, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        for nested in panel.get("panels", []):
            yield nested


def dashboard_exprs(path):
    """[(where, expr)] for every query target of every panel of one dashboard file."""
    with open(path) as f:
        dashboard = json.load(f)
    exprs = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("expr"):
                exprs.append((f"{os.path.basename(path)}: {panel.get('title')} "
                              f"[{target.get('refId')}]", target["expr"]))
    return exprs


def load_rules(path):
    with open(path) as f:
        return [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"]]


def rule_exprs(paths=RULE_FILES):
    """[(kind, name, expr)] with kind "record" or "alert"."""
    out = []
    for path in paths:
        for rule in load_rules(path):
            kind = "record" if "record" in rule else "alert"
            out.append((kind, rule[kind], rule["expr"]))
    return out


def substitute_grafana_vars(expr, values=None):
    """Replaces $var and ${var} with GRAFANA_VARS (or `values`); unknown variables raise."""
    values = dict(GRAFANA_VARS, **(values or {}))

    def replace(match):
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def metric_names(expr):
    """Metric names an expression selects, found by stripping what cannot be one: strings,
    label matchers {...}, ranges [...], grouping clauses by/without/on/ignoring/group_x (...),
    function calls, numbers and durations, and PromQL keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\$\{\w+\}|\$\w+", "", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names
