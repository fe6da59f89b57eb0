"""Sends one real request again and again, each time cut in two at the next
byte: the first `offset` bytes, a pause, the rest. Then reads the answer
(keep-alive: one connection for all of them).

Usage: split_request_client.py PORT REQUEST_FILE [--tls]
Prints READY, waits for a line on stdin (the recorder has attached), then
prints one JSON line per request: the offset, and the CLOCK_MONOTONIC ns just
before each piece was written (first_ns, second_ns) and the answer's status.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import sys
import time
from pathlib import Path

PAUSE_S = 0.003   # long enough for the server to read the first piece alone


def connect(port: int, tls: bool) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # each piece its own segment
    if tls:
        # the server's certificate is the test's own, made for this run
        sock = ssl._create_unverified_context().wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


def main() -> None:
    port, request, tls = int(sys.argv[1]), Path(sys.argv[2]).read_bytes(), "--tls" in sys.argv[3:]
    sock = connect(port, tls)
    print("READY", flush=True)
    sys.stdin.readline()
    for offset in range(1, len(request)):
        first_ns = time.monotonic_ns()
        sock.sendall(request[:offset])
        time.sleep(PAUSE_S)
        second_ns = time.monotonic_ns()
        sock.sendall(request[offset:])
        # Acknowledge the answer's segments at once: uvicorn writes its head and body apart,
        # and Nagle holds the body for the ACK of the head, which a delayed ACK sends ~40 ms
        # late. Every request would take that (a minute for the thousand cuts); it is not what
        # is tested here. (Linux clears the flag by itself: it is set again for each answer.)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        answer = http.client.HTTPResponse(sock, method="POST")
        answer.begin()
        answer.read()
        print(json.dumps({"offset": offset, "first_ns": first_ns, "second_ns": second_ns,
                          "status": answer.status}), flush=True)
    sock.close()


if __name__ == "__main__":
    main()
