"""The agent goes on when the kernel refuses one process's uprobes.

A server adopted while the agent runs maps its own copy of libssl; before it
starts, the test holds a real uprobe on that copy's SSL_read with another
USDT semaphore offset than the agent's (what a second tracer of the same
file does), so the kernel refuses the agent's SSL_read probe in it. Asserted:
the agent logs that failure once (pid, probe set, what, the kernel's answer),
counts it in inferprobe_attach_failures_total, hooks the copy's other
functions, and records every request of another server made afterwards, each
at the time that server logged it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from inferprobe.collector.binaries.tls_libraries import tls_libraries

from tests.integration.deploy.agent_support import Agent, hold_uprobe, metric
from tests.support.backends import free_port
from tests.support.kernel import needs_root
from tests.support.processes import ServerProcess, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]

HERE = Path(__file__).resolve().parent
SYSTEM_LIBSSL = Path("/usr/lib/x86_64-linux-gnu/libssl.so.3")
INGRESS_MATCH_NS = 5_000_000
AFTER_FAILURE_REQUESTS = 5


def _get(port: int, path: str) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        assert resp.status == 200
        resp.read()


def _wait_for(agent: Agent, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(agent.lines):
            if needle in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"no line with {needle!r} in {''.join(agent.lines)}")


def test_a_refused_uprobe_costs_one_process_that_probe_only(tmp_path):
    if platform.machine() != "x86_64" or not SYSTEM_LIBSSL.exists():
        pytest.skip("needs x86_64 (the perf_event_open number) and Debian's libssl.so.3")
    private = tmp_path / "lib"
    private.mkdir()
    shutil.copy2(SYSTEM_LIBSSL, private / "libssl.so.3")
    other = ServerProcess(tmp_path / "other.jsonl")
    late_port = free_port()
    held = late = agent = None
    try:
        agent = Agent(tmp_path / "ring", "--port", str(other.port), "--port", str(late_port),
                      "--prometheus", f"127.0.0.1:{(metrics_port := free_port())}",
                      "--keep", "60s", "--segment", "60s")
        env = {**os.environ, "LD_LIBRARY_PATH": str(private)}
        offset = _ssl_read_address(private / "libssl.so.3")
        held = hold_uprobe(str(private / "libssl.so.3"), offset, ref_ctr_offset=2)
        late = subprocess.Popen([sys.executable, str(HERE / "ssl_linked_server.py"),
                                 "--port", str(late_port)], stdout=subprocess.PIPE, text=True, env=env)
        assert late.stdout.readline().startswith("LISTENING")
        maps = Path(f"/proc/{late.pid}/maps").read_text()
        assert str(private / "libssl.so.3") in maps, "the late server must map the private libssl copy"

        failure = _wait_for(agent, f"attach failed: tls in pid {late.pid}", 30)
        attached = _wait_for(agent, f"of {private / 'libssl.so.3'} in pid {late.pid}", 10)
        assert f"SSL_read in {private / 'libssl.so.3'}: " in failure and "Invalid argument" in failure
        hooked = attached.split("attached to ", 1)[1].split(" of ", 1)[0].split(", ")
        assert "SSL_read" not in hooked and {"SSL_write", "SSL_read_ex", "SSL_write_ex"} <= set(hooked)
        assert (metric(metrics_port, 'inferprobe_attach_failures_total{probe_set="tls"}') or 0) >= 1

        t_after = time.monotonic_ns()
        for i in range(AFTER_FAILURE_REQUESTS):
            _get(other.port, f"/health?after={i}")
            _get(late_port, f"/late?after={i}")
        time.sleep(1.5)
        rc, out, err = agent.stop()
        agent = None
    finally:
        if held is not None:
            os.close(held)
        if agent is not None:
            agent.stop()
        if late is not None:
            late.terminate()
            late.wait(timeout=10)
        other.stop()
    assert rc == 0, err
    assert out.count(f"attach failed: tls in pid {late.pid}") == 1, "said once, not retried every second"
    assert f"{out.count('inferprobe: attach failed:')} failed attaches" in out

    report = subprocess.run(inferprobe_cmd("report", "--last", "5m", "--ring", str(tmp_path / "ring"),
                                           "--format", "json"), capture_output=True, text=True, check=True)
    requests = json.loads(report.stdout)["requests"]
    logged = [json.loads(line) for line in (tmp_path / "other.jsonl").read_text().splitlines()]
    logged_after = [r for r in logged if r["t_received_ns"] >= t_after]
    mine = sorted((r for r in requests if r["pid"] == other.pid and r["t_ingress_ns"] >= t_after),
                  key=lambda r: r["t_ingress_ns"])
    assert len(logged_after) == len(mine) == AFTER_FAILURE_REQUESTS
    logged_after.sort(key=lambda r: r["t_received_ns"])
    for recorded, server_side in zip(mine, logged_after, strict=True):
        assert abs(recorded["t_ingress_ns"] - server_side["t_received_ns"]) < INGRESS_MATCH_NS
    late_requests = [r for r in requests if r["pid"] == late.pid and r["path"].startswith("/late")]
    assert len(late_requests) == AFTER_FAILURE_REQUESTS, "the late server's own requests are still traced"


def _ssl_read_address(path: Path) -> int:
    """SSL_read's address in the file, as the TLS set finds it (through a process mapping it)."""
    mapper = subprocess.Popen([sys.executable, "-c", "import ssl, sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE, env={**os.environ, "LD_LIBRARY_PATH": str(path.parent)})
    try:
        for _ in range(50):
            found = [lib for lib in tls_libraries(mapper.pid) if lib.path == str(path)]
            if found:
                return found[0].functions["SSL_read"]
            time.sleep(0.1)
        raise AssertionError(f"no process mapped {path}")
    finally:
        mapper.stdin.close()
        mapper.wait(timeout=10)


def _usdt_server(tmp_path: Path, name: str, port: int | None = None) -> tuple[subprocess.Popen, int, Path]:
    """A USDT-firing server on its own copy of the probe library: (process, port, that copy)."""
    from inferprobe.probes import _usdt

    copy = tmp_path / name / Path(_usdt.__file__).name
    copy.parent.mkdir()
    shutil.copy2(_usdt.__file__, copy)
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "usdt_copy_server.py"), "--port", str(port),
                             "--extension", str(copy)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("LISTENING")
    return proc, port, copy


def _usdt_locations(path: Path) -> list[int]:
    from bcc import USDT

    context = USDT(path=str(path))   # kept while its probes are read: they point into it
    return [probe.get_location(i).address for probe in context.enumerate_probes()
            if probe.provider == b"inferprobe" for i in range(probe.num_locations)]


def test_a_server_whose_usdt_probes_are_refused_at_start_up_loses_only_those(tmp_path):
    refused, refused_port, refused_copy = _usdt_server(tmp_path, "refused")
    fine, fine_port, _ = _usdt_server(tmp_path, "fine")
    held = [hold_uprobe(str(refused_copy), address, ref_ctr_offset=2)
            for address in _usdt_locations(refused_copy)]
    agent = None
    try:
        agent = Agent(tmp_path / "ring", "--port", str(refused_port), "--port", str(fine_port),
                      "--prometheus", f"127.0.0.1:{(metrics_port := free_port())}",
                      "--keep", "60s", "--segment", "60s")
        failure = _wait_for(agent, f"attach failed: usdt in pid {refused.pid}", 10)
        assert "request_start" in failure and "Invalid argument" in failure
        assert (metric(metrics_port, 'inferprobe_attach_failures_total{probe_set="usdt"}') or 0) >= 1
        for i in range(AFTER_FAILURE_REQUESTS):
            _get(refused_port, f"/refused?{i}")
            _get(fine_port, f"/fine?{i}")
        time.sleep(1.5)
        rc, out, err = agent.stop()
        agent = None
    finally:
        for fd in held:
            os.close(fd)
        if agent is not None:
            agent.stop()
        for proc in (refused, fine):
            proc.terminate()
            proc.wait(timeout=10)
    assert rc == 0, err
    assert f"attach failed: usdt in pid {fine.pid}" not in out
    report = subprocess.run(inferprobe_cmd("report", "--last", "5m", "--ring", str(tmp_path / "ring"),
                                           "--format", "json"), capture_output=True, text=True, check=True)
    requests = json.loads(report.stdout)["requests"]
    by_pid = {pid: [r for r in requests if r["pid"] == pid] for pid in (refused.pid, fine.pid)}
    # Both servers' requests are recorded from their sockets; only the refused one lacks its own view.
    assert len(by_pid[refused.pid]) == len(by_pid[fine.pid]) == AFTER_FAILURE_REQUESTS
    assert all(r["usdt_request_id"] is not None for r in by_pid[fine.pid])
    assert all(r["usdt_request_id"] is None for r in by_pid[refused.pid])


def test_a_usdt_server_started_after_the_agent_gets_its_probes(tmp_path):
    """Adopted while the agent runs, a server carrying inferprobe's USDT probes gets them:
    libbpf reads each probe's arguments from its note when it attaches (the built usdt set),
    where bcc had to know every probe before it compiled. Its requests carry the server's
    own ids, from the first request after the note."""
    port = free_port()
    agent = None
    server = None
    try:
        agent = Agent(tmp_path / "ring", "--port", str(port), "--keep", "60s", "--segment", "60s")
        server, _, _ = _usdt_server(tmp_path, "late", port=port)
        _wait_for(agent, "usdt: attached", 15)
        for i in range(AFTER_FAILURE_REQUESTS):
            _get(port, f"/late?{i}")
        time.sleep(1.5)
        rc, out, err = agent.stop()
        agent = None
    finally:
        if agent is not None:
            agent.stop()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    assert rc == 0, err
    assert f"usdt: attached 11 probe(s) in pid {server.pid}" in out, out
    report = subprocess.run(inferprobe_cmd("report", "--last", "5m", "--ring", str(tmp_path / "ring"),
                                           "--format", "json"), capture_output=True, text=True, check=True)
    mine = [r for r in json.loads(report.stdout)["requests"] if r["pid"] == server.pid]
    assert len(mine) == AFTER_FAILURE_REQUESTS
    assert all(r["usdt_request_id"] is not None for r in mine), mine
