"""Stopping `record`: the recording is written and the prompt back at once,
and the kernel still takes every probe off.

Detaching ~40 perf-event probes waits for an RCU grace period each, one after
another (~2 s here): collector/attach/detach_on_exit.py leaves that to a child
that outlives the recorder. These check both halves: the recorder (and its
pipes, which a caller reads until EOF) is done quickly, and the programs it
loaded are gone from the kernel soon after, none left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from inferprobe.collector.model.recording import read_recording

from tests.support.kernel import needs_root
from tests.support.paths import REPO
from tests.support.processes import Recorder, stop_process

# The test SSE server: it links libssl, so the TLS set's uprobes are attached
# too, as on most inference servers.
SSE_SERVER = REPO / "tests" / "servers" / "sse_server.py"


def _program_ids() -> set[int]:
    shown = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return {program["id"] for program in json.loads(shown.stdout)}


@needs_root
def test_stop_returns_at_once_and_the_kernel_detaches_every_probe_after(tmp_path):
    server = subprocess.Popen([sys.executable, str(SSE_SERVER), "--host", "127.0.0.1", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().startswith("LISTENING")
        _record_and_stop(tmp_path, server.pid)
    finally:
        stop_process(server)


def _record_and_stop(tmp_path, pid: int) -> None:
    before = _program_ids()
    rec = Recorder([pid], tmp_path / "stop.ipr")
    ours = _program_ids() - before
    assert len(ours) >= 20, "the socket set's programs should be loaded while recording"

    asked = time.monotonic()
    out, err = rec.stop()   # SIGTERM, then stdout and stderr read to EOF
    stopped_s = time.monotonic() - asked
    assert rec.proc.returncode == 0, err
    assert "inferprobe: wrote" in out
    recording = read_recording(tmp_path / "stop.ipr")
    assert recording.complete and [t["pid"] for t in recording.meta["targets"]] == [pid]
    # Before the hand-over this was 2-2.5 s here (sockets and TLS), almost all of it the detach.
    assert stopped_s < 1.0, f"record took {stopped_s:.2f} s to stop"

    deadline = time.monotonic() + 20
    while (left := ours & _program_ids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{len(left)} of our BPF programs still loaded 20 s after record exited"
