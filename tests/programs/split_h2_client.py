"""Sends one real HTTP/2 request (prior knowledge, h2c), made by the h2
library that httpx and hypercorn speak HTTP/2 with, again and again on a new
connection each time, cut in two at the next byte: the connection preface,
SETTINGS, the request's HEADERS and DATA frames up to `offset`, a pause, the
rest. Then reads the answer to its stream's end.

Usage: split_h2_client.py PORT BODY_JSON
Prints READY and waits for a line on stdin (the recorder has attached),
then one JSON line per request: the offset, the CLOCK_MONOTONIC ns just
before each piece was written (first_ns, second_ns), the status and how
many SSE "data:" events other than [DONE] came back.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events

PAUSE_S = 0.003
SECRET = "sk-SECRET-h2split-90ab"


def request_bytes(port: int, body: bytes) -> tuple[h2.connection.H2Connection, bytes]:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
                          (":authority", f"127.0.0.1:{port}"), ("content-type", "application/json"),
                          ("authorization", f"Bearer {SECRET}")])
    conn.send_data(1, body, end_stream=True)
    return conn, conn.data_to_send()


def answer(sock: socket.socket, conn: h2.connection.H2Connection) -> tuple[int, int]:
    status, text = 0, b""
    while True:
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("the server closed the connection before the stream ended")
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived):
                text += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                events = [e for e in text.split(b"\n\n") if e.startswith(b"data: ") and e != b"data: [DONE]"]
                return status, len(events)
        sock.sendall(conn.data_to_send())


def main() -> None:
    port, body = int(sys.argv[1]), sys.argv[2].encode()
    whole = request_bytes(port, body)[1]
    print("READY", flush=True)
    sys.stdin.readline()
    for offset in range(1, len(whole)):
        conn, request = request_bytes(port, body)   # a fresh connection's bytes: the same each time
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            first_ns = time.monotonic_ns()
            sock.sendall(request[:offset])
            time.sleep(PAUSE_S)
            second_ns = time.monotonic_ns()
            sock.sendall(request[offset:])
            status, tokens = answer(sock, conn)
        print(json.dumps({"offset": offset, "first_ns": first_ns, "second_ns": second_ns, "status": status,
                          "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
