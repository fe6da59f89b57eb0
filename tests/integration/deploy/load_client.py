"""Syscall-heavy HTTP load for the agent tests: GET /health on a fresh connection each time.

    python load_client.py PORT SECONDS THREADS

Prints one JSON line at the end: connections made and requests answered.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

REQUEST = b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def _hammer(port: int, until: float, counts: list[int]) -> None:
    while time.monotonic() < until:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            counts[0] += 1
            sock.sendall(REQUEST)
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
            if reply.startswith(b"HTTP/1.1 200"):
                counts[1] += 1


def main() -> int:
    port, seconds, threads = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    until = time.monotonic() + seconds
    counts = [[0, 0] for _ in range(threads)]
    workers = [threading.Thread(target=_hammer, args=(port, until, c)) for c in counts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(json.dumps({"connections": sum(c[0] for c in counts), "answered": sum(c[1] for c in counts)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
