"""A threaded HTTP server whose requests contend for the GIL on demand.

"GET /gil?cpu_ms=N" runs a pure-Python loop in the thread that read the
request until that thread has used N ms of CPU (time.thread_time_ns): when
several arrive at once, their threads take turns holding the GIL and spend
the rest of their span waiting for it. "GET /calm?cycles=N&sleep_us=W" does
N rounds of a little Python work and a W µs sleep: time.sleep releases the
GIL and takes it back uncontended when nothing else runs. Both answer with
their own measurement: span (ingress to answer), the thread's CPU time and
its native tid. Prints "LISTENING <port>" when ready.
"""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from threaded_json import reply_json, serve


def spin(cpu_ns: int) -> int:
    """Pure-Python arithmetic until this thread has used cpu_ns of CPU; holds the GIL
    except when the interpreter's switch interval hands it to a waiting thread."""
    end = time.thread_time_ns() + cpu_ns
    acc = 0
    while time.thread_time_ns() < end:
        for i in range(2000):
            acc = (acc * 31 + i) % 1000003
    return acc


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        t_read = time.monotonic_ns()
        cpu0 = time.thread_time_ns()
        url = urlparse(self.path)
        q = parse_qs(url.query)
        if url.path == "/gil":
            spin(int(q.get("cpu_ms", ["200"])[0]) * 1_000_000)
        else:
            sleep_s = int(q.get("sleep_us", ["2000"])[0]) / 1e6
            for _ in range(int(q.get("cycles", ["20"])[0])):
                sum(range(1000))
                time.sleep(sleep_s)
        reply_json(self, {"span_ns": time.monotonic_ns() - t_read,
                           "cpu_ns": time.thread_time_ns() - cpu0,
                           "tid": threading.get_native_id()})

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    serve(Handler)


if __name__ == "__main__":
    sys.exit(main())
