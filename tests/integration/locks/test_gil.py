"""End to end: GIL contention in a Python threaded server, seen by `record --locks`.

tests/servers/gil_server.py: GIL_STREAMS concurrent /gil requests each run a
pure-Python loop until their thread has used CPU_MS of CPU, so their threads
take turns holding the GIL; then /calm requests, one at a time, sleep in
short steps with nothing else running, so re-taking the GIL after each sleep
never waits.

What the tracer must see (the waits are recognised from CPython's
PyEval_RestoreThread / take_gil frames: analyzers/locks.py):

- each /gil request has gil_wait_ns > 0, a share of its span of at least
  GIL_SHARE_MIN, and no more than the time its thread was not on a CPU by its
  own count (span - thread CPU time, plus TOLERANCE of the span);
- locks[] has an entry of kind "gil";
- each /calm request has a GIL wait below CALM_SHARE_MAX of its span.

GIL_SHARE_MIN: with 4 threads wanting the GIL, each holds it about a quarter
of the time and waits about 3/4; runqueue delay on 2 shared cores and the
tail (the last thread to finish runs alone) take some of that. Measured here
(2 shared vCPUs, Debian python3.11, 4 runs, 16 requests): shares of
0.658-0.738, with the threads' own off-CPU share about 0.05 above. Before the
analyzer learned the unnamed take_gil (docs/locks.md) the same requests showed
0.03: most waits were counted as handoff. The bound 0.4 leaves room for a
busier machine and still fails on that. /calm measured 0-0.002.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.cli import json_report
from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import ListeningProgram, Recorder

pytestmark = [needs_root, pytest.mark.bpf]

GIL_STREAMS = 4
CPU_MS = 150
GIL_SHARE_MIN = 0.4
CALM_SHARE_MAX = 0.02
TOLERANCE = 0.03
# Of a thread's time off CPU, what runqueue delay may take rather than the GIL (measured ~0.05).
RUNQUEUE_SHARE = 0.1


@pytest.fixture(scope="module")
def gil_traced(tmp_path_factory):
    server = ListeningProgram([sys.executable, str(SERVERS / "gil_server.py")])
    try:
        recording = tmp_path_factory.mktemp("gil-rec") / "gil.ipr"
        rec = Recorder([server.pid], recording, "--locks", "--duration", "60")
        with ThreadPoolExecutor(GIL_STREAMS) as pool:
            gil = list(pool.map(lambda _: server.get(f"/gil?cpu_ms={CPU_MS}"), range(GIL_STREAMS)))
        calm = [server.get("/calm?cycles=20&sleep_us=2000") for _ in range(2)]
        rec.stop()
    finally:
        server.stop()
    own = {}
    for status, body in gil + calm:
        assert status == 200
        o = json.loads(body)
        own[o["tid"]] = o
    return json_report(recording), own


def _requests(report: dict, path: str) -> list[dict]:
    return [r for r in report["requests"] if (r["path"] or "").startswith(path)]


def test_gil_requests_wait_for_the_gil(gil_traced):
    report, own = gil_traced
    gil = _requests(report, "/gil")
    assert len(gil) == GIL_STREAMS
    for r in gil:
        wait = r["lock_wait"]
        share = wait["gil_wait_ns"] / wait["span_ns"]
        o = own[r["tid"]]
        off_cpu_share = (o["span_ns"] - o["cpu_ns"]) / o["span_ns"]
        # The waits the threads had, by their own count: on a busy host the four requests
        # may overlap less (CI, 2026-12-05: a thread off CPU for 0.18 of its span, the tracer
        # finding 0.25). Then the tracer must find that much, less the runqueue's share.
        expected = GIL_SHARE_MIN if off_cpu_share >= GIL_SHARE_MIN + RUNQUEUE_SHARE else \
            off_cpu_share - RUNQUEUE_SHARE
        assert share >= expected, (share, off_cpu_share)
        # The tracer cannot find more GIL wait than the thread was off CPU.
        # Its span (read returned -> reply written) is a little longer than
        # the one the handler timed itself, and that margin can be all
        # off-CPU: taking the GIL back after the read, and again to reply.
        margin = max(0, wait["span_ns"] - o["span_ns"])
        off_cpu_bound = o["span_ns"] - o["cpu_ns"] + margin
        assert wait["gil_wait_ns"] <= off_cpu_bound + TOLERANCE * wait["span_ns"], (
            wait["gil_wait_ns"], off_cpu_bound, margin)
        # GIL waits are lock waits too: they count toward mutex.wait.ratio
        assert wait["lock_wait_ns"] >= wait["gil_wait_ns"]


def test_locks_list_has_the_gil(gil_traced):
    report, _ = gil_traced
    gil_locks = [lk for lk in report["locks"] if lk["kind"] == "gil"]
    assert gil_locks, [(lk["kind"], lk["classified_by"]) for lk in report["locks"]]
    assert report["lock_summary"]["waits_by_kind"]["gil"]["waits"] > 0


def test_calm_requests_do_not_wait_for_the_gil(gil_traced):
    report, _ = gil_traced
    calm = _requests(report, "/calm")
    assert len(calm) == 2
    for r in calm:
        wait = r["lock_wait"]
        assert wait["gil_wait_ns"] <= CALM_SHARE_MAX * wait["span_ns"], wait
