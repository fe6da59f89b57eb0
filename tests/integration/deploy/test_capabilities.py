"""The DaemonSet's capabilities are enough, and fewer are refused in one sentence.

The agent runs as root with exactly the capabilities the manifest adds
(`setpriv --bounding-set`: a root process gets no capability outside its
bounding set), records a request a server answered, and is refused cleanly
without CAP_BPF.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from inferprobe.collector.model.recording import read_recording
from inferprobe.collector.model.segment_ring import list_segments

from tests.integration.deploy.agent_support import Agent
from tests.support.backends import free_port
from tests.support.kernel import needs_root
from tests.support.processes import ServerProcess, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]

HERE = Path(__file__).resolve().parent
DAEMONSET = HERE.parents[2] / "deploy" / "kubernetes" / "base" / "daemonset.yaml"
SYSTEM_LIBSSL = Path("/usr/lib/x86_64-linux-gnu/libssl.so.3")


def _manifest_capabilities() -> list[str]:
    (container,) = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["containers"]
    return container["securityContext"]["capabilities"]["add"]


def _bounding(caps: list[str]) -> list[str]:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run with a reduced capability set")
    return ["setpriv", "--bounding-set", "-all," + ",".join("+" + c.lower() for c in caps), "--"]


def _one_request_under_the_manifest(tmp_path: Path, url: str, *agent_args: str) -> tuple[int, str, str]:
    """The agent with exactly the manifest's capabilities (never CAP_SYS_ADMIN) while one request is
    made: its exit code, stdout and stderr."""
    agent = Agent(tmp_path / "ring", *agent_args, "--keep", "60s", "--segment", "60s",
                  prefix=_bounding(_manifest_capabilities()))
    status = Path(f"/proc/{agent.pid}/status").read_text()
    effective = int(next(ln for ln in status.splitlines() if ln.startswith("CapEff:")).split()[1], 16)
    assert effective & (1 << 21) == 0, "CAP_SYS_ADMIN must not be held"
    time.sleep(1)
    subprocess.run(["curl", "-s", "-m", "5", url], check=True, capture_output=True)
    time.sleep(1.5)
    return agent.stop()


def test_the_manifest_capabilities_are_enough(tmp_path):
    server = ServerProcess(tmp_path / "server.jsonl")
    try:
        rc, out, err = _one_request_under_the_manifest(tmp_path, f"http://127.0.0.1:{server.port}/health")
    finally:
        server.stop()
    assert rc == 0, err
    logged = [json.loads(line) for line in (tmp_path / "server.jsonl").read_text().splitlines()]
    events = read_recording(list_segments(tmp_path / "ring")[-1].path)
    report = subprocess.run(inferprobe_cmd("report", "--last", "5m", "--ring", str(tmp_path / "ring"),
                                           "--format", "json"), capture_output=True, text=True, check=True)
    mine = [r for r in json.loads(report.stdout)["requests"] if r["pid"] == server.pid]
    assert events.complete and len(mine) == len(logged) == 1
    assert mine[0]["path"] == "/health" and abs(mine[0]["t_ingress_ns"] - logged[0]["t_received_ns"]) < 5e6


def test_without_cap_bpf_the_agent_says_so_in_one_sentence(tmp_path):
    caps = [c for c in _manifest_capabilities() if c != "BPF"]
    result = subprocess.run([*_bounding(caps), *inferprobe_cmd("agent", "--ring", str(tmp_path), "-d", "1")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Operation not permitted" in lines[0] and "Traceback" not in result.stderr


def test_with_the_manifest_capabilities_uprobes_attach(tmp_path):
    """TLS uprobes in a server, with exactly the DaemonSet's capabilities (no CAP_SYS_ADMIN).

    Since Linux 6.16 perf_event_open() refuses uprobes without CAP_SYS_ADMIN; inferprobe
    then creates them through tracefs' uprobe_events (collector/attach/tracefs_uprobes.py),
    which the DaemonSet mounts writable for it (docs/deploy.md). The server maps a private
    copy of libssl, so that no other tracer on the host holds probes on the same instructions."""
    if not SYSTEM_LIBSSL.exists():
        pytest.skip("needs Debian's /usr/lib/x86_64-linux-gnu/libssl.so.3")
    private = tmp_path / "lib"
    private.mkdir()
    shutil.copy2(SYSTEM_LIBSSL, private / "libssl.so.3")
    port = free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "ssl_linked_server.py"), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "LD_LIBRARY_PATH": str(private)})
    try:
        assert server.stdout.readline().startswith("LISTENING")
        rc, out, err = _one_request_under_the_manifest(tmp_path, f"http://127.0.0.1:{port}/x",
                                                       "--port", str(port))
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert rc == 0, err
    assert "attach failed" not in out, out
    recording = read_recording(list_segments(tmp_path / "ring")[-1].path)
    assert recording.final["attach_failures"]["total"] == 0
    (attachment,) = [a for a in recording.snapshots["tls"]["attachments"] if a["pid"] == server.pid]
    assert attachment["path"] == str(private / "libssl.so.3") and not attachment["failed"]
    assert {"SSL_read", "SSL_write", "SSL_read_ex", "SSL_write_ex"} <= set(attachment["hooked"])


def test_an_event_a_killed_tracer_left_in_tracefs_does_not_block_the_attach():
    """Without CAP_SYS_ADMIN a uprobe is a tracefs event named after the tracer's pid; an agent
    killed with SIGKILL leaves its events there, and the next agent with that pid (pid 1 of the
    restarted container) met EEXIST on every probe. The program writes such an entry itself."""
    program = Path(__file__).resolve().parents[2] / "programs" / "stale_uprobe_event.py"
    result = subprocess.run([*_bounding(_manifest_capabilities()), sys.executable, str(program)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["stale_before"]
    if not seen["through_tracefs"]:
        pytest.skip("this kernel allows perf uprobes without CAP_SYS_ADMIN: no tracefs event is made")
    assert seen["hits"] >= seen["calls"] and seen["gone_after"], seen
