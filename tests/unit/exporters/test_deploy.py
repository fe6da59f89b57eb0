"""The shipped alert rules and dashboard: checked and unit-tested with promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from inferprobe.exporters.metrics import Metrics

from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) not installed: "
                                    "run sudo make setup")


def _series_names() -> set[str]:
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}
    return {family.name + suffix for family in Metrics({}).registry.collect()
            for suffix in suffixes[family.type]}


@needs_promtool
def test_alert_rules_pass_promtool_check():
    done = subprocess.run([PROMTOOL, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 rules found" in done.stdout


@needs_promtool
def test_alert_rule_unit_tests_fire_and_stay_quiet():
    done = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=DEPLOY / "prometheus",
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _metric_names(expr: str) -> set[str]:
    words = set(re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*(?=\s*[{\[])", expr))
    return {w for w in words if "_" in w}  # every metric name has one; PromQL functions and prose do not


def test_rules_and_dashboard_only_use_metrics_the_exporter_serves():
    served = _series_names()
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    dashboard = json.loads((DEPLOY / "grafana" / "inferprobe-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(rules)
    used = set().union(*(_metric_names(e) for e in exprs))
    assert used and used <= served, used - served
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("first token", "inter-token", "end-to-end", "phase", "queue", "occupancy", "stall",
                  "mutex", "lost"):
        assert topic in titles
