"""The copies of the shared constants that cannot import them say the same numbers.

collector/shared_constants.py holds each number once; Python imports it. The
alert rule, the dashboard, the prose (README.md, docs/) and the header's own
comments restate some of them as text: a change on one side only fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from inferprobe.collector import shared_constants as shared

from tests.support.paths import REPO

ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "inferprobe-dashboard.json"

THRESHOLD = shared.MUTEX_WAIT_THRESHOLD
PERCENT = f"{round(100 * THRESHOLD)} %"


def _block(path: Path, start: str, next_item: str) -> str:
    """The YAML list item that starts with `start`, as text (no YAML parser is a dependency)."""
    text = path.read_text()
    begin = text.index(start)
    end = text.find(next_item, begin + len(start))
    return text[begin:] if end < 0 else text[begin:end]


def test_the_alert_rule_fires_above_the_threshold_and_says_it():
    rule = _block(ALERTS, "- alert: InferprobeMutexWaitHigh", "- alert:")
    assert "inferprobe_mutex_wait_ratio" in rule
    assert re.search(rf"\) > {re.escape(str(THRESHOLD))}\n", rule)
    assert re.search(rf'summary: ".*\(> {PERCENT}\)"\n', rule)


def test_the_alert_rule_unit_test_straddles_the_threshold():
    case = _block(ALERT_TESTS, "- name: mutex wait ratio", "\n  - name:")
    assert f"above and below {THRESHOLD}" in case
    assert re.search(rf'summary: ".*\(> {PERCENT}\)"\n', case)


def test_the_dashboard_panel_counts_requests_above_the_threshold():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (panel,) = [p for p in panels
                if any("inferprobe_mutex_wait_ratio_bucket" in t["expr"] for t in p["targets"])]
    assert f"ratio > {THRESHOLD}" in panel["title"]
    # the panel reads the histogram's cumulative bucket at the threshold: it must be an edge
    assert all(f'le="{THRESHOLD}"' in t["expr"] for t in panel["targets"])


def test_python_takes_the_threshold_from_the_shared_module():
    from inferprobe.analyzers import locks
    from inferprobe.exporters import metrics

    assert locks.DEFAULT_MUTEX_THRESHOLD == THRESHOLD
    assert THRESHOLD in metrics.RATIO_BUCKETS


def test_the_docs_name_the_same_threshold():
    # every ratio the prose puts beside "mutex" (a sentence either way)
    near_mutex = re.compile(r"mutex[^.]{0,80}?\b(0\.\d+)|\b(0\.\d+)\b[^.]{0,40}mutex", re.I)
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = " ".join(doc.read_text().split()).replace("mutex.wait.ratio", "mutex_wait_ratio")
        found += [(doc.name, float(m.group(1) or m.group(2))) for m in near_mutex.finditer(text)]
    assert len(found) >= 5
    assert all(value == THRESHOLD for _, value in found), found


def test_the_window_geometry_in_prose_is_the_kernels():
    prose = " ".join((REPO / "docs" / "how-requests-are-found.md").read_text().split())
    assert (f"over its first {shared.SSE_SCANNED_BYTES_PLAIN:,} bytes "
            f"({shared.SSE_SCANNED_BYTES_VECTORED:,} for a vectored write)") in prose
    assert f"overlapping the one before by {shared.WINDOW_OVERLAP} bytes" in prose
    header = " ".join(re.sub(r"\n\s*\* ", " ", (REPO / "bpf" / "inferprobe.h").read_text()).split())
    assert (f"{shared.SCAN_HEAD_BYTES} + {shared.MAX_BODY_WINDOWS} * {shared.SSE_WINDOW_STEP} "
            f"= {shared.SSE_SCANNED_BYTES_PLAIN} bytes") in header
    assert f"fit in the 33 the kernel allows: {shared.SSE_SCANNED_BYTES_VECTORED} bytes" in header


# Words in a CUDA function's name that say what kind of call it is.
CATEGORY_WORDS = {"launch": ("LAUNCH",), "wait": ("SYNCHRONIZE", "WAIT_EVENT"), "copy": ("MEMCPY",),
                  "memory": ("MEM_ALLOC", "MEM_FREE", "MALLOC", "FREE"), "query": ("GET_",)}


def test_every_gpu_function_lies_in_the_range_of_its_kind():
    from inferprobe.collector.model import gpu_catalog
    from inferprobe.collector.model.events import GPU_FN_MAX, GpuFunction

    for fn in GpuFunction:
        category = gpu_catalog.category(fn)
        assert any(word in fn.name for word in CATEGORY_WORDS[category]), (fn.name, category)
        assert fn < GPU_FN_MAX
    assert {gpu_catalog.category(fn) for fn in GpuFunction} == set(gpu_catalog.Category)
