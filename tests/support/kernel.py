"""For tests that load BPF programs: the root-only marker, and a probe set's events captured in memory."""

from __future__ import annotations

import os

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loads BPF programs: needs root")


class KernelCapture:
    """Probe sets loaded onto one process, their events kept and decoded in
    memory: for tests that check the kernel side's events one by one."""

    def __init__(self, pid: int | list[int], sets: tuple[str, ...] = ("sockets",),
                 options: dict | None = None, ringbuf_pages: int = 64) -> None:
        from inferprobe.collector.attach.loader import load_tracer
        from inferprobe.collector.attach.ringbuf import RingBufferReader

        self._chunks: list[bytes] = []
        pids = pid if isinstance(pid, list) else [pid]
        self.tracer = load_tracer(pids, sets=sets, ringbuf_pages=ringbuf_pages, options=options)
        self.reader = RingBufferReader(self.tracer, self._chunks.append)

    def finish(self) -> tuple[list, dict]:
        """Drains and unloads; returns (decoded events, the kernel's counters)."""
        from inferprobe.collector.model.events import decode
        from inferprobe.collector.model.ringbuf_format import iter_ring_records

        self.reader.drain()
        counters = self.tracer.counters()
        self.close()
        return [decode(raw) for chunk in self._chunks for raw in iter_ring_records(chunk)], counters

    def __enter__(self) -> KernelCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unloads; safe to call again, and after finish()."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None


def bytes_moved(events: list, pid: int) -> list:
    """The process's socket reads and writes that moved bytes, in the order
    the kernel sent them (collector IoRecords)."""
    from inferprobe.collector.model.events import IoRecord

    return [e for e in events if isinstance(e, IoRecord) and e.pid == pid and e.bytes > 0]


def scripted_exchange(python_script, script_dir, exchanges: list,
                      options: dict | None = None) -> tuple[list, dict, int]:
    """tests/support/processes.SCRIPTED_SERVER answering each request with exact writes,
    over a real TCP connection, with the sockets set on it: (decoded events, the kernel's
    counters, the server's pid). `exchanges`: (request bytes, its writes), a write being
    bytes (one send) or a list of bytes (one sendmsg, an iovec each). `python_script` is
    the fixture of that name."""
    import json
    import socket

    from tests.support.processes import SCRIPTED_SERVER

    def hexed(write):
        return [part.hex() for part in write] if isinstance(write, list) else write.hex()

    script = script_dir / "steps.json"
    script.write_text(json.dumps([[hexed(w) for w in writes] for _, writes in exchanges]))
    server = python_script(SCRIPTED_SERVER, str(script))
    port = int(server.stdout.readline())
    with KernelCapture(server.pid, options=options) as capture:
        with socket.create_connection(("127.0.0.1", port)) as client:
            for request, writes in exchanges:
                client.sendall(request)
                want = sum(len(b"".join(w) if isinstance(w, list) else w) for w in writes)
                got = 0
                while got < want:
                    got += len(client.recv(65536))
            client.sendall(b"x")
        server.wait(timeout=10)
        events, counters = capture.finish()
    return events, counters, server.pid
