"""Token events a real asyncio server coalesced while its client read slowly.

CPython 3.12+ asyncio transports send what they have queued with one
sendmsg(), an iovec per queued write; a slow reader makes a server queue.
Here a Python 3.12 asyncio server streams SSE token events into a socket
with small buffers, and the client reads only once the server reports data
queued in its transport. The writes the server made are then real: plain
send()s first, then sendmsg()s of many events, split wherever the socket had
room. The server's byte stream is known exactly, so each traced write's
bytes are known too (the writes of one connection are in order); the token
events the kernel counted in each write must be the "data:" lines whole in
it, within the windows it scans (bpf/sock.bpf.c).
"""

from __future__ import annotations

import socket
import subprocess

import pytest

from inferprobe.collector.model.events import EventType, HttpFlag

from tests.support.kernel import KernelCapture, bytes_moved, needs_root
from tests.support.pythons import PY312
from tests.support.sse_scan import sse_events_counted

pytestmark = [pytest.mark.bpf, needs_root,
              pytest.mark.skipif(PY312 is None, reason="no CPython 3.12+ on this host: its asyncio's "
                                 "vectored writes cannot be produced (3.11's join the queue into one send)")]

EVENTS = 60

SERVER = r"""
import asyncio, json, socket, sys

EVENTS = int(sys.argv[1])
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


def chunk(data):
    return b"%x\r\n" % len(data) + data + b"\r\n"


def event(i):
    body = {"id": "chatcmpl-%024d" % i, "object": "chat.completion.chunk", "created": 1700000000,
            "choices": [{"index": 0, "delta": {"content": " token %d" % i}, "finish_reason": None}],
            "pad": "p" * (i % 97)}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stream():
    return HEAD + b"".join(chunk(event(i)) for i in range(EVENTS)) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


async def handle(reader, writer):
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    await reader.readuntil(b"\r\n\r\n")
    writer.write(HEAD)
    for i in range(EVENTS):
        writer.write(chunk(event(i)))
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    print("QUEUED", writer.transport.get_write_buffer_size(), flush=True)
    await writer.drain()
    await reader.read(1)
    writer.close()


async def main():
    if sys.argv[2:] == ["--print-stream"]:
        sys.stdout.write(stream().hex())
        return
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def test_events_an_asyncio_server_queued_and_sent_at_once_are_each_counted(python_script):
    stream = bytes.fromhex(subprocess.run([PY312, "-c", SERVER, str(EVENTS), "--print-stream"],
                                          capture_output=True, text=True, check=True).stdout)
    server = python_script(SERVER, str(EVENTS), python=PY312)
    port = int(server.stdout.readline())
    with KernelCapture(server.pid) as capture:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /v1/completions HTTP/1.1\r\nHost: h\r\n\r\n")
        queued = server.stdout.readline().split()
        assert queued[0] == "QUEUED" and int(queued[1]) > 0, queued  # the slow reader made it queue
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            got += client.recv(65536)
        client.sendall(b"x")
        client.close()
        events, counters = capture.finish()
    assert got == stream
    writes = [e for e in bytes_moved(events, server.pid) if e.type == EventType.SOCK_WRITE]
    assert sum(w.bytes for w in writes) == len(stream)
    at, expected = 0, []
    for w in writes:
        expected.append(sse_events_counted(stream[at:at + w.bytes], HttpFlag.VECTORED in w.flags))
        at += w.bytes
    assert [w.sse_events for w in writes] == expected
    # it was the case under test: events that were queued, sent several to a sendmsg()
    assert any(HttpFlag.VECTORED in w.flags and w.sse_events >= 2 for w in writes), \
        [(w.bytes, w.sse_events, w.flags) for w in writes]
    assert sum(expected) >= EVENTS - 2  # an event is lost only where a write splits its "data:"
    assert counters["events_lost"] == 0
