"""The TLS set's per-process state (links, looked-at files, Go offsets) goes at the process's
exit; what the snapshot says of exited processes is bounded."""

from __future__ import annotations

import ctypes

from inferprobe.collector.attach.probe_sets import tls
from inferprobe.collector.attach.probe_sets.tls import TlsAttachment, TlsProbes


class _Link:
    def __init__(self) -> None:
        self.destroyed = False

    def destroy(self) -> None:
        self.destroyed = True


class _Table(dict):
    def __delitem__(self, key) -> None:
        super().__delitem__(key.value if isinstance(key, ctypes.c_uint32) else key)


def test_an_exited_process_s_tls_state_goes_and_a_live_one_s_stays(monkeypatch):
    monkeypatch.setattr(tls, "MAX_EXITED", 3)
    monkeypatch.setattr(tls, "destroy_all", lambda links: [link.destroy() for link in links])
    probes = TlsProbes()
    offsets = _Table({pid: "offsets" for pid in range(1, 11)})
    bpf = {b"go_tls_offsets": offsets}
    links = {pid: [_Link(), _Link()] for pid in range(1, 11)}
    for pid in range(1, 11):
        probes._done.add((pid, (1, 2)))
        probes._go_done.add(pid)
        probes._links[pid] = list(links[pid])
        probes.attachments.append(TlsAttachment(pid=pid, path="/lib/libssl.so.3", kind="openssl"))
        probes.unhooked.append({"pid": pid, "path": "/x", "library": "boringssl"})
    probes._failed_pids.add(7)
    del offsets[5]   # one without Go offsets
    gone = probes._forget_exited(bpf, alive=lambda pid: pid == 10)
    assert gone == list(range(1, 10))
    assert all(link.destroyed for pid in range(1, 10) for link in links[pid])
    assert not any(link.destroyed for link in links[10])
    assert set(offsets) == {10} and set(probes._links) == {10}
    assert probes._done == {(10, (1, 2))} and probes._go_done == {10} and probes._failed_pids == set()
    assert [a.pid for a in probes.attachments] == [10] and [u["pid"] for u in probes.unhooked] == [10]
    assert [a.pid for a in probes.exited] == [7, 8, 9] and probes.exited_dropped == 6
    assert probes._forget_exited(bpf, alive=lambda pid: pid == 10) == []
