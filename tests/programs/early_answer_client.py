"""Writes each request's head and large body in one blocking write() while a
second thread reads the answer, which tests/servers/early_answer_server.py
starts before it reads the body: the response's first read returns while the
request's write is still under way.

Usage: early_answer_client.py PORT CALLS. Prints READY, waits for a line on
stdin (the recorder has attached), then makes CALLS calls on one keep-alive
connection and prints one JSON line per call, CLOCK_MONOTONIC ns: when it
began, when its write() returned, when the status line and each token event
reached the application, and when the call returned.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

BODY_BYTES = 32 << 20   # beyond loopback's socket buffers: the write returns only once the server reads it


def read_answer(reader, seen: dict) -> None:
    status = reader.readline()
    seen["head_ns"] = time.monotonic_ns()
    seen["status"] = int(status.split()[1])
    while reader.readline() not in (b"\r\n", b""):
        pass
    seen["received_ns"] = []
    while True:
        size = int(reader.readline().strip(), 16)
        data = reader.read(size + 2)[:size]
        if size == 0:
            return
        if b'"content"' in data:
            seen["received_ns"].append(time.monotonic_ns())


def call(sock: socket.socket, reader, k: int) -> dict:
    body = b'{"model":"early-%d","stream":true,"pad":"%s"}' % (k, b"x" * BODY_BYTES)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    request = head + body   # made before the call begins: copying 32 MB is not the call's time
    seen: dict = {}
    answer = threading.Thread(target=read_answer, args=(reader, seen))
    answer.start()
    began = time.monotonic_ns()
    sock.sendall(request)   # a blocking socket: one write() of it all
    written = time.monotonic_ns()
    answer.join()
    return {"began_ns": began, "written_ns": written, "returned_ns": time.monotonic_ns(), **seen}


def main() -> None:
    port, calls = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(None)   # blocking: no poll loop of partial sends
    reader = sock.makefile("rb")
    print("READY", flush=True)
    sys.stdin.readline()
    for k in range(calls):
        print(json.dumps(call(sock, reader, k)), flush=True)
    sock.close()


if __name__ == "__main__":
    main()
