"""kill -9 of the agent under load, then its restart (about 40 s here).

A server answers streamed completions five times a second while the agent
records it, with exactly the DaemonSet's capabilities where setpriv is there
(on Linux 6.16+ its TLS uprobes are then tracefs events: the case that leaves
state in the kernel). A second server is traced too, and exits while the
agent is down. Asserted:
- at most LOSS_MAX_S lost: `report --last`, read after the kill, holds every
  request the server logged as finished more than LOSS_MAX_S before it
  (the segment is flushed every RING_FLUSH_S; the reader takes a segment
  without its end record, or cut short, up to its last whole record);
- nothing of the killed agent in the kernel once the next one has started:
  none of its BPF links, programs or maps (by the ids its files held), no
  child of its own holding them, none of its tracefs uprobe events, those of
  the server that exited meanwhile included (the next agent removes them:
  collector/attach/tracefs_uprobes.py remove_stale_events);
- the restarted agent re-adopts the same server and records each of its new
  requests exactly once.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from inferprobe.cli.agent import RING_FLUSH_S

from tests.integration.deploy.agent_support import Agent
from tests.integration.deploy.test_capabilities import _manifest_capabilities
from tests.support.kernel import needs_root
from tests.support.processes import ServerProcess, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]

LOSS_MAX_S = 1.0
MATCH_NS = 5_000_000   # a traced request's ingress against the server's t_received_ns
COMPLETION = json.dumps({"prompt": "hi", "max_tokens": 3, "stream": True})
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")


def _completion(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/completions", body=COMPLETION, headers={"Content-Type": "application/json"})
    assert conn.getresponse().read().count(b"data:") >= 3
    conn.close()


def _prefix() -> list[str] | None:
    """The DaemonSet's capabilities (no CAP_SYS_ADMIN), as test_capabilities.py runs the agent."""
    if shutil.which("setpriv") is None:
        return None
    caps = ",".join("+" + c.lower() for c in _manifest_capabilities())
    return ["setpriv", "--bounding-set", f"-all,{caps}", "--"]


def _bpf_ids(pid: int) -> dict[str, set[int]]:
    """The BPF links, programs and maps pid's files hold, by id (from /proc/PID/fdinfo)."""
    ids: dict[str, set[int]] = {"link": set(), "prog": set(), "map": set()}
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in info.splitlines():
            key, _, value = line.partition(":")
            if key in ("link_id", "prog_id", "map_id"):
                ids[key.removesuffix("_id")].add(int(value))
    return ids


def _alive_ids(kind: str) -> set[int]:
    out = subprocess.run(["bpftool", "-j", kind, "list"], capture_output=True, text=True, check=True).stdout
    return {obj["id"] for obj in json.loads(out or "[]")}


def _uprobe_events() -> list[str]:
    try:
        return [line for line in UPROBE_EVENTS.read_text().splitlines() if "inferprobe_uprobes" in line]
    except OSError:
        return []


def _of(events: list[str], agent_pid: int | None = None, traced_pid: int | None = None) -> list[str]:
    """The inferprobe uprobe events an agent made (its group names its pid) or that probe a pid."""
    return [line for line in events
            if (agent_pid is not None and line.split()[0].split("/")[0].endswith(f"_{agent_pid}"))
            or (traced_pid is not None and line.split()[0].endswith(f"_{traced_pid}"))]


def _traced(ring: Path, pid: int) -> list[dict]:
    argv = inferprobe_cmd("report", "--last", "5m", "--ring", str(ring), "--format", "json")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [r for r in json.loads(result.stdout)["requests"] if r["pid"] == pid]


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _seen(entry: dict, traced: list[dict]) -> int:
    return sum(abs(r["t_ingress_ns"] - entry["t_received_ns"]) <= MATCH_NS for r in traced)


def test_kill_9_loses_under_a_second_and_a_restart_leaves_nothing_behind(tmp_path):
    assert RING_FLUSH_S <= LOSS_MAX_S / 2
    server = ServerProcess(tmp_path / "server.jsonl")
    other = ServerProcess(tmp_path / "other.jsonl")   # exits while the agent is down
    ring = tmp_path / "ring"
    ports = ("--port", str(server.port), "--port", str(other.port))
    agent = again = None
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            _completion(server.port)
            stop.wait(0.2)

    loader = threading.Thread(target=load)
    try:
        agent = Agent(ring, "--keep", "12s", "--segment", "3s", *ports, prefix=_prefix())
        _completion(other.port)
        loader.start()
        time.sleep(random.uniform(5, 8))   # a random point of the segment and of the flush period
        killed = agent.pid
        held = _bpf_ids(killed)
        children = Path(f"/proc/{killed}/task/{killed}/children").read_text().split()
        events_before = _of(_uprobe_events(), killed)
        killed_ns = time.monotonic_ns()
        os.kill(killed, signal.SIGKILL)
        agent.proc.wait(timeout=60)   # the kernel detaches its probes as it exits: ~50 ms each here
        stop.set()
        loader.join()
        after_kill = _traced(ring, server.pid)

        other.stop()
        restarted_ns = time.monotonic_ns()
        again = Agent(ring, "--keep", "12s", "--segment", "3s", *ports, prefix=_prefix())
        again_pid = again.pid
        left = {kind: held[kind] & _alive_ids(kind) for kind in held} if shutil.which("bpftool") else {}
        events_left = _uprobe_events()
        attached_ns = time.monotonic_ns()
        for _ in range(10):
            _completion(server.port)
            time.sleep(0.2)
        time.sleep(1.5)   # two flushes
        after_restart = _traced(ring, server.pid)
        rc, out, err = again.stop()
        again = None
        events_after_stop = _of(_uprobe_events(), traced_pid=server.pid)
    finally:
        stop.set()
        if loader.is_alive():
            loader.join()
        for running in (agent, again):
            if running is not None and running.proc.poll() is None:
                running.proc.kill()
                running.proc.wait()
        server.stop()
        other.stop()

    # at most LOSS_MAX_S of finished requests lost
    assert after_kill, "the ring held nothing of the server before the kill"
    first = min(r["t_ingress_ns"] for r in after_kill)
    finished = [e for e in _log(tmp_path / "server.jsonl")
                if e["t_eof_ns"] and first - MATCH_NS <= e["t_received_ns"] and e["t_eof_ns"] < killed_ns]
    missing = [round((killed_ns - e["t_eof_ns"]) / 1e9, 3) for e in finished if not _seen(e, after_kill)]
    assert len(finished) >= 20 and all(s <= LOSS_MAX_S for s in missing), \
        f"lost requests that finished this many s before the kill: {missing}"

    # nothing of the killed agent left once the next one started
    assert not children, f"the agent had child processes: {children}"
    assert not any(left.values()), f"BPF objects of the killed agent still loaded: {left}"
    assert not _of(events_left, killed, other.pid), _of(events_left, killed, other.pid)
    if events_before:   # tracefs uprobes (no CAP_SYS_ADMIN, Linux 6.16+): the next agent made its own
        assert _of(_of(events_left, again_pid), traced_pid=server.pid)

    # the restarted agent re-adopted the server: each new request once
    assert rc == 0, err
    logged = [e for e in _log(tmp_path / "server.jsonl") if e["t_received_ns"] >= attached_ns]
    assert len(logged) == 10
    assert [_seen(e, after_restart) for e in logged] == [1] * 10
    assert len([r for r in after_restart if r["t_ingress_ns"] >= restarted_ns]) == 10
    assert not events_after_stop, events_after_stop   # a clean stop removes its own
