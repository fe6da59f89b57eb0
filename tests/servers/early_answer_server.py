"""Answers a request before reading its body, as servers that stream early do.

Usage: early_answer_server.py. Prints its port, then serves one connection at
a time: reads a request's head, writes the response head and the first token
of a chunked SSE stream at once, waits EARLY_S, reads the whole body (its
Content-Length), then writes the other tokens, "data: [DONE]" and the last
chunk. A client that writes head and body in one blocking write() reads the
response's first bytes while that write is still under way.
"""

from __future__ import annotations

import socket
import time

EARLY_S = 0.05
TOKENS = 3
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Cache-Control: no-cache\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def token(i: int) -> bytes:
    return chunk(b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i)


def read_head(conn: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(4096)
        if not more:
            return None
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def serve(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (got := read_head(conn)) is not None:
        head, body = got
        conn.sendall(HEAD + token(0))
        time.sleep(EARLY_S)
        left = content_length(head) - len(body)
        while left > 0:
            more = conn.recv(min(left, 1 << 20))
            if not more:
                return
            left -= len(more)
        for i in range(1, TOKENS):
            conn.sendall(token(i))
            time.sleep(0.005)
        conn.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            serve(conn)


if __name__ == "__main__":
    main()
