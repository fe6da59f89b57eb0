"""The host-wide set forgets adopted processes at their exit: live state, ctx.pids, their
sockets and rejections go; what the snapshot says of exited ones is bounded."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import NamedTuple

from inferprobe.collector.attach.probe_sets import host_wide
from inferprobe.collector.attach.probe_sets.host_wide import Adopted, HostWideProbes


class _Table(dict):
    """A map as BpfObject hands it out: items() and del by ctypes key."""

    def __delitem__(self, key) -> None:
        super().__delitem__(key.value if isinstance(key, ctypes.c_uint32) else key)


class _SockKey(NamedTuple):
    pid: int
    fd: int


def test_exited_processes_leave_every_live_structure_and_the_snapshot_keeps_a_bounded_list(monkeypatch):
    monkeypatch.setattr(host_wide, "MAX_EXITED", 4)
    probes = HostWideProbes()
    for pid in range(1, 8):
        probes.state.adopted[pid] = Adopted(pid, f"srv{pid}", "listen", 8000 + pid, t_ns=pid)
    probes.state.serving_http = {1, 2, 7}
    probes.state.released = {3: "srv3", 6: "srv6"}
    socks = {_SockKey(pid, fd): SimpleNamespace(http_seen=1, tls=0, unrecognised=0)
             for pid in range(1, 8) for fd in (5, 6)}
    socks_table = _Table(socks)
    rejected = _Table({3: 1, 6: 1})
    bpf = {b"socks": socks_table, b"host_wide_rejected": rejected,
           b"host_wide_counters": {}}
    ctx = SimpleNamespace(pids=list(range(1, 8)))

    gone = probes.forget_exited(bpf, ctx, alive=lambda pid: pid in (6, 7))

    assert gone == {1, 2, 3, 4, 5}
    assert set(probes.state.adopted) == {6, 7}
    assert probes.state.serving_http == {7} and probes.state.released == {6: "srv6"}
    assert ctx.pids == [6, 7]
    assert {key.pid for key in socks_table} == {6, 7}   # the dead ones' sockets went
    assert set(rejected) == {6}   # a reused pid 3 is judged afresh
    # the snapshot's list of exited processes: the newest MAX_EXITED, the rest counted
    assert [a.pid for a, _, _ in probes.state.exited] == [2, 3, 4, 5]
    assert probes.state.exited_dropped == 1
    assert probes.forget_exited(bpf, ctx, alive=lambda pid: pid in (6, 7)) == set()   # nothing twice


def test_a_pid_seen_again_after_its_exit_is_adopted_afresh():
    probes = HostWideProbes()
    probes._note(42, "listen", 8000, 1)
    bpf = {b"socks": _Table(), b"host_wide_rejected": _Table()}
    probes.forget_exited(bpf, SimpleNamespace(pids=[42]), alive=lambda pid: False)
    assert probes._note(42, "accept", 0, 2)   # new: the pid's next process
    assert probes.state.adopted[42].how == "accept"
