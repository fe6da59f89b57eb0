"""An SSE server that writes like hyper and other vectored-I/O stacks do.

Reads requests with recvmsg(2). Every response: the headers in one
sendmsg(2); each token chunk as writev(2) of three iovecs (chunk size line,
the SSE event, CRLF); the end as one sendmsg(2) of four iovecs, the [DONE]
chunk and the terminating "0\\r\\n\\r\\n" in its own iovec, so the chunked
terminator "\\r\\n0\\r\\n\\r\\n" is split across two. Keep-alive.

Prints "LISTENING <port>"; at exit (stdin closed) one JSON line with, per
request, the monotonic time just after its last write returned.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

TOKENS = 5
HEADERS = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")


def chunk_iovecs(payload: bytes) -> list[bytes]:
    return [f"{len(payload):x}\r\n".encode(), payload, b"\r\n"]


def serve(conn: socket.socket, ends: list[int]) -> None:
    buf = b""
    while True:
        data, *_ = conn.recvmsg(4096)
        if not data:
            return
        buf += data
        while b"\r\n\r\n" in buf:
            _, buf = buf.split(b"\r\n\r\n", 1)
            conn.sendmsg([HEADERS])
            for i in range(TOKENS):
                os.writev(conn.fileno(), chunk_iovecs(f"data: tok{i}\n\n".encode()))
                time.sleep(0.002)
            conn.sendmsg([*chunk_iovecs(b"data: [DONE]\n\n"), b"0\r\n\r\n"])
            ends.append(time.monotonic_ns())


def main() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    print(f"LISTENING {srv.getsockname()[1]}", flush=True)
    ends: list[int] = []

    def accept_loop() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=serve, args=(conn, ends), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    sys.stdin.read()
    print(json.dumps({"ends_ns": ends}), flush=True)


if __name__ == "__main__":
    main()
