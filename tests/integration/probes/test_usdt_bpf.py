"""Real tracing of the probes, by a tracer of the tests' own on libbpf's USDT
support: every probe fires with its arguments in the documented order, and the
semaphores follow attach and detach.

Three children fire the same values: Python through the C extension, and the
C/C++ header compiled as C and as C++ (usdt_trace.py has the protocol).
"""

from __future__ import annotations

import sys

import pytest

from inferprobe.probes import probe, usdt

from tests.programs.usdt_trace import HERE, Child, Tracer, build_c_child, expected_events
from tests.support.kernel import needs_root

pytestmark = [pytest.mark.bpf, needs_root]

LANGUAGES = ["python", "c", "c++"]


@pytest.fixture(params=LANGUAGES)
def child(request, tmp_path):
    if request.param == "python":
        assert usdt.available, usdt.reason
        argv = [sys.executable, str(HERE / "probe_child.py")]
    else:
        argv = [str(build_c_child(tmp_path, request.param))]
    c = Child(argv)
    c.language = request.param
    yield c
    c.close()


def test_every_probe_fires_with_its_arguments_in_order(child):
    tracer = Tracer(child.pid)
    try:
        skipped = child.fire()
        want = expected_events()
        got = tracer.wait_for(len(want))
        assert got == want
        if child.language == "python":
            # The float and the 2**63 argument were dropped, not raised.
            assert skipped == 2
        # Nothing extra arrives late (e.g. the skipped calls).
        assert tracer.wait_for(len(want) + 1, timeout=0.3) == want
    finally:
        tracer.detach()


def test_enabled_follows_attach_and_detach(child):
    assert child.enabled() is False
    # One probe only, the last in the table: enabled must watch them all.
    tracer = Tracer(child.pid, probes=[probe("kv_usage")])
    try:
        assert child.enabled() is True
        child.fire()
        # Only the attached probe reaches the tracer.
        kv = [e for e in expected_events() if e[0] == "kv_usage"]
        assert tracer.wait_for(len(kv)) == kv
    finally:
        tracer.detach()
    assert child.enabled() is False
