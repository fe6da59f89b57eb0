"""End to end: requests attributed to the process, namespace pid and cgroup that
served them, and the caller's W3C trace context carried into the report and
into the spans a real Phoenix stores.

Four servers on two stacks (uvicorn and Go's net/http, tests/servers/stream_shapes_*):
on each stack one runs on the host, one in a pid namespace of its own and a
cgroup2 group of its own, both made here with `unshare` and a directory under
the cgroup2 mount (this host mounts it as the hybrid `unified` hierarchy).
One recorder follows all four. Each server gets requests whose traceparent
stands early, past the first 512 bytes (behind a long header), past them in a
second write of the headers (the server reads the block in two), none, and an
invalid one; each valid one names a trace and a parent of its own.

Ground truth: the host pid and NSpid the test reads from /proc for each
server, the cgroup it made, and the ids it sent.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from inferprobe.collector.model.events import TraceContextFlag, TraceContextRecord, decode
from inferprobe.collector.model.recording import read_recording

from tests.support.go import build_go_program
from tests.support.kernel import needs_root
from tests.support.node import node_binary
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import Recorder, inferprobe_cmd, stop_namespace_init, stop_process

pytestmark = [needs_root, pytest.mark.bpf]

PAYLOADS = SERVERS / "stream_shapes_payloads.json"
PATH = "/v1/chat/completions"
FILLER = 1500  # bytes of a header before the traceparent: it starts past the classifier's 512
# The request shapes each server gets, in order: where the traceparent stands.
SHAPES = ("early", "past_512", "past_512_split", "none", "invalid")


def cgroup2_root() -> Path:
    """Where cgroup2 is mounted: /sys/fs/cgroup (unified hosts) or /sys/fs/cgroup/unified (hybrid)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    pytest.skip("no cgroup2 hierarchy is mounted on this host")


def own_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"pid {pid} has no cgroup v2 line")


def ns_pids(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:]]
    raise AssertionError("no NSpid line")


class Server:
    """A test server on the host, or (contained) in a pid namespace and cgroup2 group of its own."""

    def __init__(self, name: str, argv: list[str], contained: bool, tmp_path: Path,
                 cgroup_name: str | None = None):
        self.name, self.contained = name, contained
        self.cgroup_dir: Path | None = None
        self.pid = 0  # the listening process's host pid, once it is up
        if contained:
            cgroup_name = cgroup_name or f"inferprobe-test-{name}-{uuid.uuid4().hex[:8]}"
            self.cgroup_dir = cgroup2_root() / cgroup_name
            self.cgroup_dir.mkdir()
            # The shell joins the group, then unshare forks the server as pid 1 of a new pid namespace.
            argv = ["sh", "-c", f'echo $$ > {self.cgroup_dir}/cgroup.procs && exec unshare --pid --fork '
                    '--mount-proc --kill-child "$@"', "sh", *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=tmp_path)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"{name} did not start: {line!r}")
        self.port = int(line)
        self.pid = self._server_pid()
        self.ns_pid = ns_pids(self.pid)[-1]

    def _server_pid(self) -> int:
        """The host pid of the process that listens: unshare's child when contained."""
        if not self.contained:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    @property
    def cgroup(self) -> str:
        return "/" + self.cgroup_dir.name if self.cgroup_dir else own_cgroup(os.getpid())

    def stop(self) -> None:
        if self.contained and self.pid:
            stop_namespace_init(self.pid, self.proc)
        else:
            stop_process(self.proc)
        if self.cgroup_dir is not None:
            for _ in range(50):  # the group empties as its processes are reaped
                try:
                    self.cgroup_dir.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def trace_ids(server_index: int, k: int) -> tuple[str, str]:
    """A trace id and parent span id of their own for request k of a server."""
    trace = uuid.UUID(int=(server_index + 1) << 64 | (k + 1)).hex
    return trace, f"{(server_index + 1) << 32 | (k + 7):016x}"


def send(port: int, shape: str, trace: str, parent: str) -> int:
    """One request on its own connection, laid out as `shape` says; the status it got."""
    body = json.dumps({"model": "m", "tokens": 3, "prompt": "hello", "interval_ms": 1}).encode()
    if shape == "invalid":
        context = f"traceparent: 00-{'0' * 32}-{parent}-01\r\n"
    elif shape == "none":
        context = ""
    else:
        context = f"traceparent: 00-{trace}-{parent}-01\r\ntracestate: inferprobe=t{parent[-4:]},other=1\r\n"
    filler = f"x-filler: {'f' * FILLER}\r\n" if shape.startswith("past_512") else ""
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"{filler}{context}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    if shape.startswith("past_512"):
        assert head.index(b"traceparent") > 512
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        if shape == "past_512_split":
            # The header block in two writes, cut inside the filler: the server reads it in two.
            sock.sendall(head[:FILLER // 2])
            time.sleep(0.1)
            sock.sendall(head[FILLER // 2:] + body)
        else:
            sock.sendall(head + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("containers")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        pytest.skip("FastAPI/uvicorn are not installed (the test extra installs them)")
    go = build_go_program(SERVERS / "stream_shapes.go", tmp_path)
    stacks = {"uvicorn": lambda log: [sys.executable, str(SERVERS / "stream_shapes_fastapi.py"), str(log)],
              "go": lambda log: [str(go), str(PAYLOADS), str(log)]}
    servers: list[Server] = []
    try:
        for stack, argv in stacks.items():
            for contained in (False, True):
                name = f"{stack}-{'ns' if contained else 'host'}"
                servers.append(Server(name, argv(tmp_path / f"{name}.log"), contained, tmp_path))
        truth = {s.name: {"pid": s.pid, "ns_pids": ns_pids(s.pid), "cgroup": s.cgroup} for s in servers}
        recording = tmp_path / "run.ipr"
        args: list[str] = []
        for s in servers:
            args += ["-p", str(s.pid)]
        rec = Recorder([], recording, *args, "--duration", "120")
        sent = {}
        for i, s in enumerate(servers):
            sent[s.name] = []
            for k, shape in enumerate(SHAPES):
                trace, parent = trace_ids(i, k)
                assert send(s.port, shape, trace, parent) == 200
                sent[s.name].append((shape, trace, parent))
        time.sleep(0.3)
        rec.stop()
    finally:
        for s in servers:
            s.stop()
    report = subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"),
                            capture_output=True, text=True, check=True).stdout
    return {"report": json.loads(report), "truth": truth, "sent": sent, "recording": recording}


def requests_of(traced: dict, name: str) -> list[dict]:
    pid = traced["truth"][name]["pid"]
    mine = [r for r in traced["report"]["requests"] if r["pid"] == pid]
    return sorted(mine, key=lambda r: r["t_ingress_ns"])


def test_each_request_is_attributed_to_its_process_namespace_pid_and_cgroup(traced):
    for name, truth in traced["truth"].items():
        reqs = requests_of(traced, name)
        assert len(reqs) == len(SHAPES), name
        contained = name.endswith("-ns")
        assert (len(truth["ns_pids"]) > 1) == contained  # the test's own ground truth
        want_ns = truth["ns_pids"][-1] if contained else None
        assert {(r["ns_pid"], r["cgroup"]) for r in reqs} == {(want_ns, truth["cgroup"])}, name
        if contained:
            assert truth["cgroup"].startswith("/inferprobe-test-") and want_ns != truth["pid"]
    groups = {g["cgroup"]: g for g in traced["report"]["cgroups"]}
    for name, truth in traced["truth"].items():
        if name.endswith("-ns"):
            g = groups[truth["cgroup"]]
            assert g["pids"] == [truth["pid"]] and g["summary"]["requests"] == len(SHAPES)
            assert g["ns_pids"] == {str(truth["pid"]): truth["ns_pids"][-1]}
            assert g["container_id"] is None  # a cgroup named by no container runtime


def test_report_carries_the_callers_trace_context_wherever_the_header_stood(traced):
    for name in traced["truth"]:
        for (shape, trace, parent), r in zip(traced["sent"][name], requests_of(traced, name), strict=True):
            got = (r["trace_id"], r["parent_span_id"], r["trace_flags"], r["tracestate"])
            if shape in ("none", "invalid"):
                assert got == (None, None, None, None), (name, shape)
            else:
                assert got == (trace, parent, 1, f"inferprobe=t{parent[-4:]},other=1"), (name, shape)
    assert traced["report"]["trace_context"] == {
        "requests": 3 * len(traced["truth"]), "invalid_traceparents": len(traced["truth"])}


def test_a_header_block_read_in_two_is_followed_into_the_second_read(traced):
    """The split requests' traceparent came in the server's second read of the block."""
    records = [ev for ev in map(decode, read_recording(traced["recording"]).events)
               if isinstance(ev, TraceContextRecord)]
    split = {trace for sent in traced["sent"].values() for shape, trace, _parent in sent
             if shape == "past_512_split"}
    later = {ev.traceparent.split("-")[1] for ev in records
             if ev.traceparent and TraceContextFlag.LATER_IO in ev.flags}
    assert split <= later
    # and the others in the read of their request line, one record each
    others = [ev for ev in records if ev.traceparent and ev.traceparent.split("-")[1] not in split]
    assert len(others) == 3 * len(traced["truth"]) and not any(TraceContextFlag.LATER_IO in ev.flags
                                                                for ev in others)


def test_no_other_header_value_leaves_the_kernel(traced):
    raw = traced["recording"].read_bytes()
    assert b"f" * 64 not in raw  # the filler header's value
    assert b"application/json" not in raw


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    from tests.support.backends import PHOENIX_PYTHON, Phoenix

    if not PHOENIX_PYTHON.exists():
        pytest.skip(f"Arize Phoenix is not installed ({PHOENIX_PYTHON}): run sudo make setup")
    server = Phoenix(tmp_path_factory.mktemp("phoenix-tc"))
    yield server
    server.stop()


def test_spans_in_phoenix_are_children_of_the_callers_spans(traced, phoenix):
    done = subprocess.run(inferprobe_cmd("export", str(traced["recording"]), "--otlp", "--protocol",
                                         "http/protobuf", "--endpoint", phoenix.http_url),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = {(trace, parent) for sent in traced["sent"].values() for shape, trace, parent in sent
            if shape not in ("none", "invalid")}
    deadline = time.monotonic() + 30
    while True:
        spans = phoenix.spans()
        roots = {(s["context"]["trace_id"], s["parent_id"]): s for s in spans
                 if (s["context"]["trace_id"], s["parent_id"]) in want}
        if len(roots) == len(want) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(roots) == want
    by_trace: dict[str, list[dict]] = {}
    for s in spans:
        by_trace.setdefault(s["context"]["trace_id"], []).append(s)
    for (trace, _parent), root in roots.items():
        # the phases are children of the root, in the caller's trace
        kids = [s for s in by_trace[trace] if s is not root]
        assert kids and all(k["parent_id"] == root["context"]["span_id"] for k in kids)
    contained = {t["pid"]: t for n, t in traced["truth"].items() if n.endswith("-ns")}
    for root in roots.values():
        attrs = root["attributes"]
        if attrs["inferprobe.pid"] in contained:
            assert attrs["inferprobe.cgroup"] == contained[attrs["inferprobe.pid"]]["cgroup"]
            assert attrs["inferprobe.ns_pid"] == contained[attrs["inferprobe.pid"]]["ns_pids"][-1]


# The client side: a traced process's own outbound calls carry the traceparent it wrote.
CLIENT = r"""
import socket, sys, time
port, traces = int(sys.argv[1]), sys.argv[2:]
sys.stdin.readline()  # the recorder has attached
for k, pair in enumerate(traces):
    trace, parent = pair.split(":")
    body = b'{"model": "m", "tokens": 3, "prompt": "hello", "interval_ms": 1}'
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-filler: {'f' * 1500}\r\n"
            f"traceparent: 00-{trace}-{parent}-01\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        if k % 2:  # the header block in two writes
            sock.sendall(head[:700]); time.sleep(0.05); sock.sendall(head[700:] + body)
        else:
            sock.sendall(head + body)
        while sock.recv(65536):
            pass
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def client_traced(tmp_path_factory):
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    tmp_path = tmp_path_factory.mktemp("client-tc")
    server = Server("uvicorn-untraced", [sys.executable, str(SERVERS / "stream_shapes_fastapi.py"),
                                          str(tmp_path / "server.log")], False, tmp_path)
    sent = [trace_ids(9, k) for k in range(2)]
    argv = [sys.executable, "-c", CLIENT, str(server.port), *(f"{t}:{p}" for t, p in sent)]
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    recording = tmp_path / "client.ipr"
    try:
        rec = Recorder([client.pid], recording, "--duration", "60")
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "done"
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(client)
        server.stop()
    report = subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"),
                            capture_output=True, text=True, check=True).stdout
    return {"report": json.loads(report), "sent": sent, "recording": recording, "pid": client.pid}


def test_a_clients_call_carries_the_trace_context_it_wrote(client_traced):
    calls = sorted((r for r in client_traced["report"]["requests"] if r["role"] == "client"),
                   key=lambda r: r["t_ingress_ns"])
    assert [(r["trace_id"], r["parent_span_id"]) for r in calls] == client_traced["sent"]


def test_the_clients_call_span_is_a_child_of_the_span_it_named(client_traced, phoenix):
    done = subprocess.run(inferprobe_cmd("export", str(client_traced["recording"]), "--otlp", "--protocol",
                                         "http/protobuf", "--endpoint", phoenix.http_url),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = set(client_traced["sent"])
    deadline = time.monotonic() + 30
    while True:
        found = {(s["context"]["trace_id"], s["parent_id"]): s for s in phoenix.spans()
                 if (s["context"]["trace_id"], s["parent_id"]) in want}
        if len(found) == len(want) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(found) == want
    # each is the logical call's span (call_trace: its attempts are its children)
    assert all(s["attributes"]["inferprobe.attempts"] == 1 for s in found.values())


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
def test_the_report_splits_requests_by_cgroup(traced, fmt, tmp_path):
    out = tmp_path / f"report.{fmt}"
    subprocess.run(inferprobe_cmd("report", str(traced["recording"]), "--format", fmt, "-o", str(out)),
                   capture_output=True, text=True, check=True)
    text = out.read_text()
    assert "Per cgroup" in text
    if fmt == "text":
        return  # a terminal table wraps long cells: the other two hold them whole
    for name, truth in traced["truth"].items():
        assert truth["cgroup"] in text
        if name.endswith("-ns"):
            assert f"{truth['pid']} (ns {truth['ns_pids'][-1]})" in text


def test_live_export_from_a_container_joins_the_callers_trace_and_labels_its_metrics(tmp_path, phoenix):
    """Live (`record --otlp --prometheus`): a server in a cgroup named as docker's systemd
    driver names a container's (docker-<id>.scope) and in its own pid namespace."""
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    from tests.support.backends import free_port

    cid = uuid.uuid4().hex * 2
    server = Server("live", [sys.executable, str(SERVERS / "stream_shapes_fastapi.py"),
                             str(tmp_path / "server.log")], True, tmp_path,
                    cgroup_name=f"docker-{cid}.scope")
    metrics_port = free_port()
    sent = [trace_ids(20, k) for k in range(2)]
    try:
        rec = Recorder([server.pid], tmp_path / "live.ipr", "--duration", "60", "--otlp", "--protocol",
                       "grpc", "--endpoint", phoenix.grpc_url, "--prometheus", f"127.0.0.1:{metrics_port}")
        for shape, (trace, parent) in zip(("early", "past_512"), sent, strict=True):
            assert send(server.port, shape, trace, parent) == 200
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
                scrape = resp.read().decode()
            if f'container_id="{cid}"' in scrape and "inferprobe_requests_total" in scrape:
                break
            assert time.monotonic() < deadline, scrape[-3000:]
            time.sleep(0.5)
        counted = rf'inferprobe_requests_total{{[^}}]*container_id="{cid}"[^}}]*}} 2\.0'
        assert re.search(counted, scrape), scrape
        while True:
            found = {(s["context"]["trace_id"], s["parent_id"]): s for s in phoenix.spans()
                     if (s["context"]["trace_id"], s["parent_id"]) in set(sent)}
            if len(found) == len(sent) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        rec.stop()
    finally:
        server.stop()
    assert set(found) == set(sent)
    for span in found.values():
        assert span["attributes"]["container.id"] == cid
        assert span["attributes"]["inferprobe.ns_pid"] == server.ns_pid != server.pid


def test_a_node_clients_vectored_request_is_read_past_512_bytes(tmp_path):
    """Node's http client writes its request as one writev() iovec of 1.7 KB: the scan
    follows that iovec past the head."""
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    node = node_binary()
    server = Server("node-untraced", [sys.executable, str(SERVERS / "stream_shapes_fastapi.py"),
                                      str(tmp_path / "server.log")], False, tmp_path)
    trace, parent = trace_ids(30, 0)
    argv = [node, str(PROGRAMS / "traceparent_node_client.js"), str(server.port), trace, parent]
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    recording = tmp_path / "node.ipr"
    try:
        rec = Recorder([client.pid], recording, "--duration", "60")
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "done"
        time.sleep(0.3)
        rec.stop()
    finally:
        stop_process(client)
        server.stop()
    report = json.loads(subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"),
                                       capture_output=True, text=True, check=True).stdout)
    (call,) = [r for r in report["requests"] if r["role"] == "client"]
    assert (call["trace_id"], call["parent_span_id"]) == (trace, parent)
