"""An engine's messages between its processes, read in the kernel (bpf/protocols/zmtp.bpf.h).

vLLM's API server hands each request to EngineCore and reads each step's outputs back
over ZeroMQ. Here a traced process plays the API server's end of such a connection,
opened before the recorder attaches (so found mid-stream, as on a running vLLM), and an
untraced peer in the test plays EngineCore. Two stacks move the bytes: Python's socket
module and Node's net module. What must come out: each hand-off with its id and prompt
token count, each step's entries with their ids, token counts, finish flags and the
engine's own QUEUED/SCHEDULED times to the bit, one STEP per outputs message, a message
cut by the syscalls anywhere (inside a frame header, an id, a timestamp), and no token id
anywhere in the recording.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading

import pytest

from inferprobe.collector.ingest.pipeline import decode_all
from inferprobe.collector.model.events import EngineIpcFlag, EngineIpcKind, EngineIpcRecord
from inferprobe.collector.model.recording import read_recording

from tests.support.kernel import needs_root
from tests.support.node import node_binary
from tests.support.paths import PROGRAMS
from tests.support.processes import Recorder, stop_process
from tests.support.zmtp_bytes import (
    QUEUED,
    SCHEDULED,
    add_request,
    frame,
    greeting,
    output_entry,
    outputs,
    pack,
    ready,
)

pytestmark = [needs_root, pytest.mark.bpf]

# A token id whose bytes (cd be ef: uint16) would show in the recording if one leaked.
SECRET_TOKEN = 0xBEEF
PROMPT = [SECRET_TOKEN] * 300  # over 256 bytes: a long ZMTP frame (8-byte size)
T_QUEUED, T_SCHEDULED = 51234.000123456, 51234.002345678


def _hub(path: str, accepted: list[socket.socket]) -> socket.socket:
    hub = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hub.bind(path)
    hub.listen()

    def accept() -> None:
        while True:
            try:
                accepted.append(hub.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return hub


def _say(proc: subprocess.Popen, line: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok", line


def _read_all(conn: socket.socket, n: int) -> None:
    while n:
        n -= len(conn.recv(n))


def _exchange(proc: subprocess.Popen, engine: socket.socket, name: str, cut_reads: bool) -> None:
    """Two requests handed over, then three steps of outputs: the first with both
    requests' first tokens and their events, one with a single entry, the last finishing both."""
    for rid in (f"{name}-a-1f2e3d4c", f"{name}-b-5a6b7c8d"):
        msg = add_request(rid, PROMPT)
        _say(proc, f"send {msg.hex()}")
        _read_all(engine, len(msg))
    events = [(QUEUED, T_QUEUED), (SCHEDULED, T_SCHEDULED)]
    steps = [
        outputs([output_entry(f"{name}-a-1f2e3d4c", [SECRET_TOKEN], events=events),
                 output_entry(f"{name}-b-5a6b7c8d", [SECRET_TOKEN], events=events)]),
        outputs([output_entry(f"{name}-a-1f2e3d4c", [SECRET_TOKEN, SECRET_TOKEN])]),
        outputs([output_entry(f"{name}-a-1f2e3d4c", [SECRET_TOKEN], finished=True),
                 output_entry(f"{name}-b-5a6b7c8d", [SECRET_TOKEN], finished=True)]),
    ]
    for msg in steps:
        engine.sendall(msg)
        if cut_reads:
            # reads that end inside the frame header, inside the first id, inside a timestamp
            ts_at = msg.index(struct.pack(">d", T_QUEUED)) + 3 if b"timestamp" in msg else len(msg) // 2
            cuts = sorted({1, 12, ts_at, len(msg)})
            for a, b in zip([0, *cuts], cuts, strict=False):
                _say(proc, f"recv {b - a}")
        else:
            _say(proc, f"recv {len(msg)}")
    # A layout this walk does not know (outputs as maps, as a msgspec struct without
    # array_like would send them): counted, not guessed at.
    future = frame(pack([0, [{"request_id": f"{name}-c", "new_token_ids": [SECRET_TOKEN]}]]))
    engine.sendall(future)
    _say(proc, f"recv {len(future)}")


def _connection_after_attach(proc: subprocess.Popen, accepted: list[socket.socket]) -> None:
    """A connection made while recording: each peer's greeting and READY first, as ZeroMQ
    sends them, then one hand-off and one step."""
    before = len(accepted)
    _say(proc, "reconnect")
    while len(accepted) == before:
        threading.Event().wait(0.01)
    engine = accepted[-1]
    _say(proc, f"send {(greeting() + ready(b'DEALER')).hex()}")
    _read_all(engine, len(greeting() + ready(b"DEALER")))
    engine.sendall(greeting() + ready(b"ROUTER"))
    _say(proc, f"recv {len(greeting() + ready(b'ROUTER'))}")
    msg = add_request("late-9e8d7c6b", PROMPT[:3])
    _say(proc, f"send {msg.hex()}")
    _read_all(engine, len(msg))
    step = outputs([output_entry("late-9e8d7c6b", [SECRET_TOKEN], finished=True)])
    engine.sendall(step)
    _say(proc, f"recv {len(step)}")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("zmtp")
    path = str(tmp / "engine.sock")
    accepted: list[socket.socket] = []
    hub = _hub(path, accepted)
    peers = {"python": subprocess.Popen([sys.executable, str(PROGRAMS / "zmtp_peer.py"), path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True),
             "node": subprocess.Popen([node_binary(), str(PROGRAMS / "zmtp_peer.js"), path],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)}
    engines = {}
    try:
        for name, proc in peers.items():  # one at a time, so each accepted socket is known
            assert proc.stdout.readline().strip() == "ready"
            while len(accepted) < len(engines) + 1:
                threading.Event().wait(0.01)
            engines[name] = accepted[-1]
        recording = tmp / "zmtp.ipr"
        rec = Recorder([proc.pid for proc in peers.values()], recording, "--no-engine-metrics",
                       "--duration", "60")
        try:
            _exchange(peers["python"], engines["python"], "py", cut_reads=True)
            _exchange(peers["node"], engines["node"], "js", cut_reads=False)
            _connection_after_attach(peers["python"], accepted)
        finally:
            rec.stop()
    finally:
        for proc in peers.values():
            stop_process(proc)
        hub.close()
    events, undecodable = decode_all(read_recording(recording).events)
    assert undecodable == 0
    return {"events": [e for e in events if isinstance(e, EngineIpcRecord)], "raw": recording.read_bytes(),
            "pids": {name: proc.pid for name, proc in peers.items()}, "recording": read_recording(recording)}


def _opened_before(recorded, pid: int) -> list[EngineIpcRecord]:
    """The process's events on its connection opened before the recorder attached."""
    late = {e.conn_id for e in recorded["events"] if e.request_id == "late-9e8d7c6b"}
    return [e for e in recorded["events"] if e.pid == pid and e.conn_id not in late]


@pytest.mark.parametrize("name", ["python", "node"])
def test_hand_offs_name_the_request_and_count_its_prompt(recorded, name):
    pid = recorded["pids"][name]
    adds = [e for e in _opened_before(recorded, pid) if e.kind == EngineIpcKind.ADD]
    prefix = "py" if name == "python" else "js"
    assert [(e.request_id, e.count, e.is_read) for e in adds] == [
        (f"{prefix}-a-1f2e3d4c", len(PROMPT), False), (f"{prefix}-b-5a6b7c8d", len(PROMPT), False)]


@pytest.mark.parametrize("name", ["python", "node"])
def test_each_step_gives_its_entries_then_one_step_event(recorded, name):
    pid = recorded["pids"][name]
    prefix = "py" if name == "python" else "js"
    a, b = f"{prefix}-a-1f2e3d4c", f"{prefix}-b-5a6b7c8d"
    seen = [(e.kind, e.request_id, e.count, e.index, EngineIpcFlag.FINISHED in e.flags)
            for e in _opened_before(recorded, pid) if e.kind != EngineIpcKind.ADD]
    out, step = EngineIpcKind.OUTPUT, EngineIpcKind.STEP
    assert seen == [(out, a, 1, 0, False), (out, b, 1, 1, False), (step, None, 2, 2, False),
                    (out, a, 2, 0, False), (step, None, 1, 1, False),
                    (out, a, 1, 0, True), (out, b, 1, 1, True), (step, None, 2, 2, False)]
    steps = [e for e in _opened_before(recorded, pid) if e.kind == step]
    assert len({e.message for e in steps}) == 3 and all(e.is_read for e in steps)


@pytest.mark.parametrize("name", ["python", "node"])
def test_the_engines_own_times_come_through_to_the_bit(recorded, name):
    pid = recorded["pids"][name]
    firsts = [e for e in recorded["events"] if e.pid == pid and e.kind == EngineIpcKind.OUTPUT and e.queued_s]
    assert len(firsts) == 2
    assert all(e.queued_s == T_QUEUED and e.scheduled_s == T_SCHEDULED for e in firsts)


def test_a_connection_made_while_recording_is_followed_from_its_greetings(recorded):
    pid = recorded["pids"]["python"]
    late = [(e.kind, e.count, e.is_read) for e in recorded["events"]
            if e.pid == pid and e.request_id == "late-9e8d7c6b"]
    assert late == [(EngineIpcKind.ADD, 3, False), (EngineIpcKind.OUTPUT, 1, True)]
    # the greetings were skipped as greetings: the frame walk never lost its place
    assert recorded["recording"].counter("engine_ipc_lost_sync") == 0


def test_no_token_id_leaves_the_kernel(recorded):
    # the prompt's 300 token ids and every output token are cd be ef in msgpack
    assert struct.pack(">BH", 0xCD, SECRET_TOKEN) not in recorded["raw"]


def test_nothing_was_lost_and_only_the_unknown_layout_left_unread(recorded):
    rec = recorded["recording"]
    assert rec.counter("engine_ipc_lost_sync") == 0
    assert rec.counter("engine_ipc_unread") == 2  # each stack's one message of another layout
    assert not [e for e in recorded["events"] if (e.request_id or "").endswith("-c")]
    assert rec.counter("conns_unrecognised") == 0 and rec.counter("conns_local_ipc") == 0
