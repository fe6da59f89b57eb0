#!/usr/bin/env python3
"""A plain-socket SSE server and client, for tests of what TCP does to small writes.

Unlike sse_server.py (aiohttp, which always sets TCP_NODELAY) the server
here sets TCP_NODELAY only with --nodelay, so Nagle's algorithm is in play.

    tiny_sse.py server --host 10.0.0.1 --port 8000 --chunks 60 --interval-ms 10 [--nodelay]
        prints "LISTENING <port>", serves one chunked text/event-stream per request:
        one send() per chunk "data: <i>\\n\\n", then "data: [DONE]" and the last chunk;
        keeps the connection until the client closes it.
    tiny_sse.py client --host 10.0.0.1 --port 8000 --linger 1.5
        prints "DONE" when the stream ended, lingers (the connection open and idle),
        then prints one JSON line: {"recv": [[t_ns, [chunk indexes completed]], ...]}.
Times are time.monotonic_ns(), the clock the kernel side uses.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time

HEADERS = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n")


def chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


def serve(args) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen()
    print(f"LISTENING {listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        if args.nodelay:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b""
        while b"\r\n\r\n" not in request:
            data = conn.recv(4096)
            if not data:
                break
            request += data
        conn.sendall(HEADERS)
        next_at = time.monotonic()
        for i in range(args.chunks):
            next_at += args.interval_ms / 1000
            conn.sendall(chunk(b"data: %d\n\n" % i))
            time.sleep(max(0.0, next_at - time.monotonic()))
        conn.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        while conn.recv(4096):
            pass
        conn.close()


def client(args) -> None:
    sock = socket.create_connection((args.host, args.port))
    sock.sendall(f"GET /v1/stream HTTP/1.1\r\nHost: {args.host}\r\n\r\n".encode())
    buffered = b""
    received = []
    while True:
        data = sock.recv(65536)
        now = time.monotonic_ns()
        if not data:
            break
        buffered += data
        # "data: <i>\n\n" complete in what arrived so far; consume it
        done = [int(m) for m in re.findall(rb"data: (\d+)\n\n", buffered)]
        buffered = re.sub(rb"data: \d+\n\n", b"", buffered)
        received.append([now, done])
        if b"[DONE]" in buffered:
            break
    print("DONE", flush=True)
    time.sleep(args.linger)
    sock.close()
    print(json.dumps({"recv": received}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("server", "client"))
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=60)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--nodelay", action="store_true")
    parser.add_argument("--linger", type=float, default=1.5)
    args = parser.parse_args()
    serve(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    sys.exit(main())
