#!/usr/bin/env python3
"""Writes deploy/grafana/dashboards/tokenselect.json, the TokenSelect serving dashboard.

The JSON is generated so that every panel is built the same way (templated datasource, a $job
filter, units); edit this script, run it, and commit both. deploy_dashboard_test fails when the
committed JSON and this script's output differ.

  deploy/grafana/make_dashboard.py            write the JSON
  deploy/grafana/make_dashboard.py --stdout   print it instead
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'job=~"$job"'
RATE = "$__rate_interval"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dashboards", "tokenselect.json")


def sel(metric, matchers=""):
    """A selector with the $job filter: metric{job=~"$job",matchers}."""
    return f"{metric}{{{JOB}{',' + matchers if matchers else ''}}}"


def rate(metric, matchers="", by=""):
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({sel(metric, matchers)}[{RATE}]))"


def quantile(q, histogram, by="", matchers=""):
    keys = "le" + (f", {by}" if by else "")
    return f"histogram_quantile({q}, {rate(histogram + '_bucket', matchers, keys)})"


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows of `height`."""

    def __init__(self):
        self.panels, self.x, self.y, self.next_id = [], 0, 0, 1

    def row(self, title):
        if self.x:
            self.x, self.y = 0, self.y + 8
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def panel(self, title, kind, unit, targets, width=8, height=8, description="", extra=None):
        if self.x + width > 24:
            self.x, self.y = 0, self.y + height
        refs = "ABCDEFGH"
        panel = {
            "id": self._id(), "type": kind, "title": title, "description": description,
            "datasource": DS, "gridPos": {"h": height, "w": width, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi"}} if kind == "timeseries" else
                       {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"},
            "targets": [target(expr, legend, refs[i]) for i, (expr, legend) in enumerate(targets)],
        }
        panel.update(extra or {})
        self.panels.append(panel)
        self.x += width

    def _id(self):
        self.next_id += 1
        return self.next_id - 1


def quantiles(histogram, by="", matchers="", label=""):
    legend = (label + " " if label else "") + ("{{" + by + "}} " if by else "")
    return [(quantile(q, histogram, by, matchers), f"{legend}p{int(q * 100)}")
            for q in (0.5, 0.95, 0.99)]


def build():
    lookups = "tokenselect_selection_cache_lookups_total"
    hit = 'result="hit"'
    hit_rate = f"{rate(lookups, hit)} / {rate(lookups)}"
    hit_rate_by_layer = f"{rate(lookups, hit, 'layer')} / {rate(lookups, by='layer')}"
    errors = 'code!~"OK|CANCELLED"'
    L = Layout()

    L.row("Overview")
    L.panel("Selection-cache hit rate", "stat", "percentunit", [(hit_rate, "hit rate")], width=6,
            description="Share of decode selection-cache lookups whose cached top-k was reused.")
    L.panel("Generation tokens/s", "stat", "short",
            [(rate("tokenselect_generation_tokens_total"), "tokens/s")], width=6)
    L.panel("Healthy decode workers", "stat", "short",
            [("max(" + sel("tokenselect_healthy_workers", 'role="decode"') + ")", "decode")],
            width=6, description="As the router sees them; 0 fires TokenselectNoHealthyDecodeWorker.")
    L.panel("Error ratio", "stat", "percentunit",
            [(f"{rate('tokenselect_requests_total', errors)} / "
              f"{rate('tokenselect_requests_total')}", "errors")], width=6,
            description="Finished requests whose status is neither OK nor CANCELLED.")

    L.row("Latency")
    L.panel("Time to first token", "timeseries", "s",
            quantiles("tokenselect_time_to_first_token_seconds"))
    L.panel("Inter-token latency", "timeseries", "s",
            quantiles("tokenselect_inter_token_latency_seconds"))
    L.panel("End-to-end latency", "timeseries", "s",
            quantiles("tokenselect_e2e_request_latency_seconds"))
    L.panel("Queue time p95 by phase", "timeseries", "s",
            [(quantile(0.95, "tokenselect_queue_time_seconds", "phase"), "{{phase}} p95")])
    L.panel("Prefill chunk time", "timeseries", "s",
            quantiles("tokenselect_prefill_chunk_seconds"))
    L.panel("Selection time p95", "timeseries", "s",
            [(quantile(0.95, "tokenselect_selection_seconds", "phase, policy"),
              "{{phase}} {{policy}} p95")])

    L.row("Throughput and load")
    L.panel("Tokens/s", "timeseries", "short",
            [(rate("tokenselect_prompt_tokens_total"), "prompt"),
             (rate("tokenselect_generation_tokens_total"), "generation")])
    L.panel("Running and waiting requests", "timeseries", "short",
            [(f"sum by (phase) ({sel('tokenselect_running_requests')})", "running {{phase}}"),
             (f"sum by (phase) ({sel('tokenselect_waiting_requests')})", "waiting {{phase}}")])
    L.panel("KV cache usage", "timeseries", "percentunit",
            [(f"max by (instance, phase) ({sel('tokenselect_kv_cache_usage_ratio')})",
              "{{instance}} {{phase}}")],
            extra={"fieldConfig": {"defaults": {"unit": "percentunit", "min": 0, "max": 1},
                                   "overrides": []}})

    L.row("Selection cache")
    L.panel("Hit rate per layer", "timeseries", "percentunit",
            [(hit_rate_by_layer, "layer {{layer}}")], width=12)
    L.panel("Lookups/s by result", "timeseries", "short",
            [(rate(lookups, by="result, policy"), "{{result}} {{policy}}")], width=12)

    L.row("KV transfer")
    L.panel("Transfer throughput", "timeseries", "Bps",
            [(rate("tokenselect_kv_transfer_bytes_total", by="transport"), "{{transport}}")])
    L.panel("Transfer latency per chunk", "timeseries", "s",
            quantiles("tokenselect_kv_transfer_seconds", by="transport"))
    L.panel("Transfer failures/s", "timeseries", "short",
            [(rate("tokenselect_kv_transfers_total", 'outcome="error"', "transport"),
              "{{transport}}")])

    L.row("Errors")
    L.panel("Errors by code", "timeseries", "reqps",
            [(rate("tokenselect_requests_total", 'code!="OK"', "code"), "{{code}}")], width=12)
    L.panel("Requests by outcome", "timeseries", "reqps",
            [(rate("tokenselect_requests_total", by="outcome"), "{{outcome}}")], width=12)

    return {
        "title": "TokenSelect serving",
        "uid": "tokenselect-serving",
        "description": "Latency, throughput, selection cache and KV transfer of tokenselect "
                       "(metrics: docs/metrics.md; alerts: docs/operations.md).",
        "tags": ["tokenselect"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
             "options": []},
            {"name": "job", "label": "Job", "type": "query", "datasource": DS,
             "query": {"query": "label_values(tokenselect_requests_total, job)",
                       "refId": "job"},
             "definition": "label_values(tokenselect_requests_total, job)",
             "includeAll": True, "multi": True, "allValue": ".+", "current": {}, "hide": 0,
             "refresh": 2, "regex": "", "sort": 1, "options": []},
        ]},
        "panels": L.panels,
    }


def render():
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    if "--stdout" in sys.argv[1:]:
        sys.stdout.write(render())
    else:
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        with open(OUT, "w") as f:
            f.write(render())
        print(f"wrote {OUT}")
