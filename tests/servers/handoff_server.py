"""A threaded HTTP server whose threads only hand work off to each other.

Each handler thread puts its job on JOBS (a queue.Queue) consumed by one
engine thread, waits for each of the job's tokens on the job's
threading.Condition (cond.wait(timeout=1.0)), and for its end on a
threading.Event. The engine loops on JOBS.get(timeout=0.2), so its idle
periods are timed-out waits; it "produces" each token with
time.sleep(TOKEN_S), which holds no lock and leaves the GIL free.
In CPython 3.11 all three block in a lock acquire (the waiter lock of a
Condition), yet no thread holds a lock another one wants: no request is
lock contention.

"GET /generate?tokens=N" answers with the handler's own time inside those
waits, its span (request read to answer) and its native tid.
Prints "LISTENING <port>" when ready.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from threaded_json import reply_json, serve

JOBS: queue.Queue[Job] = queue.Queue()
TOKEN_S = 0.005
IDLE_POLL_S = 0.2
TOKEN_WAIT_S = 1.0


class Job:
    def __init__(self, tokens: int):
        self.tokens = tokens
        self.produced = 0
        self.cond = threading.Condition()
        self.done = threading.Event()


def engine() -> None:
    while True:
        try:
            job = JOBS.get(timeout=IDLE_POLL_S)
        except queue.Empty:
            continue
        for _ in range(job.tokens):
            time.sleep(TOKEN_S)
            with job.cond:
                job.produced += 1
                job.cond.notify()
        job.done.set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        t_read = time.monotonic_ns()
        tokens = int(parse_qs(urlparse(self.path).query).get("tokens", ["20"])[0])
        job = Job(tokens)
        JOBS.put(job)
        waited = 0
        with job.cond:
            while job.produced < tokens:
                t0 = time.monotonic_ns()
                job.cond.wait(timeout=TOKEN_WAIT_S)
                waited += time.monotonic_ns() - t0
        t0 = time.monotonic_ns()
        job.done.wait()
        waited += time.monotonic_ns() - t0
        reply_json(self, {"wait_ns": waited, "span_ns": time.monotonic_ns() - t_read,
                          "tid": threading.get_native_id()})

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    threading.Thread(target=engine, daemon=True).start()
    serve(Handler)


if __name__ == "__main__":
    sys.exit(main())
