"""A threaded HTTP server whose requests contend on a threading.Lock on demand.

A holder thread loops: acquire LOCK, hold 9 ms, release, pause 1 ms.
"GET /contend?cycles=N&sleep_us=W" runs N cycles of LOCK.acquire()
(timed), release, sleep W us, in the thread that read the request, and
answers with its own measured wait fraction; "GET /free?..." sleeps the same way
without touching the lock. Prints "LISTENING <port>" when ready.
"""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from threaded_json import reply_json, serve

LOCK = threading.Lock()
PERIOD_S = 0.010
HOLD_S = 0.009


def holder() -> None:
    while True:
        with LOCK:
            time.sleep(HOLD_S)
        time.sleep(PERIOD_S - HOLD_S)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        t_read = time.monotonic_ns()
        q = parse_qs(urlparse(self.path).query)
        contend = urlparse(self.path).path == "/contend"
        cycles = int(q.get("cycles", ["20"])[0])
        sleep_s = int(q.get("sleep_us", ["5500"])[0]) / 1e6
        waited = 0
        for _ in range(cycles):
            if contend:
                t0 = time.monotonic_ns()
                LOCK.acquire()
                waited += time.monotonic_ns() - t0
                LOCK.release()
            time.sleep(sleep_s)
        reply_json(self, {"wait_ns": waited, "span_ns": time.monotonic_ns() - t_read,
                           "tid": threading.get_native_id()})

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    threading.Thread(target=holder, daemon=True).start()
    serve(Handler)


if __name__ == "__main__":
    sys.exit(main())
