"""Numbers that several parts of inferprobe, its tests and deploy/ must agree on.

Each is defined once: a value the kernel side decides comes from
bpf/inferprobe.h through the generated layout (collector/model/layout_generated.py),
and a value only Python decides is written here. The rest of inferprobe
imports them from this module; tests/unit/collector/test_shared_constants.py
ties the copies that cannot import (the alert rule, the dashboard, the
README and docs/) to them. It sits in collector/, the bottom of the data
flow, because every layer above may import collector/ and nothing else is
common to all.

The GPU category limits are GPU_FN_FIRST_* of the layout, used by
collector/model/gpu_catalog.py and collector/model/events.py.
"""

from __future__ import annotations

from inferprobe.collector.model.layout_generated import (
    MAX_BODY_WINDOWS,
    MAX_VECTORED_WINDOWS,
    SCAN_HEAD_BYTES,
    WINDOW_OVERLAP,
)

# How far the kernel scans a long write for SSE "data:" lines (bpf/body_windows.bpf.h,
# next_body_window): windows of SCAN_HEAD_BYTES, each starting WINDOW_OVERLAP
# before the one before ends, a plain write's first MAX_BODY_WINDOWS after the
# head, a vectored write's first MAX_VECTORED_WINDOWS.
SSE_WINDOW_BYTES = SCAN_HEAD_BYTES
SSE_WINDOW_STEP = SCAN_HEAD_BYTES - WINDOW_OVERLAP
SSE_SCANNED_BYTES_PLAIN = SCAN_HEAD_BYTES + MAX_BODY_WINDOWS * SSE_WINDOW_STEP
SSE_SCANNED_BYTES_VECTORED = SCAN_HEAD_BYTES + MAX_VECTORED_WINDOWS * SSE_WINDOW_STEP

# The design card's mutex-wait threshold: a request whose mutex.wait.ratio is
# above it is flagged (analyzers/locks.py), it is a bucket edge of the ratio
# histogram so the share of requests above it is exact (exporters/metrics.py),
# and the shipped alert rule and dashboard panel use it (deploy/).
MUTEX_WAIT_THRESHOLD = 0.37

# The probe sets `record` leaves off unless asked, and the flag that asks:
# the recorder notes them as off (cli/record.py), and the report's verdict names
# the flag where one of them would explain a finding (analyzers/verdict.py).
OPT_IN_FLAGS = {"network": "--network", "locks": "--locks", "profile": "--profile", "offcpu": "--offcpu"}
