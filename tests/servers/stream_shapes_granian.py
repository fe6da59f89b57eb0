"""The FastAPI app of stream_shapes_fastapi.py served by granian (Rust, hyper
and tokio under a Python ASGI app), as its users start it: the `granian`
command, one worker process.

Usage: stream_shapes_granian.py LOG; prints the port, then the worker's pid
(granian's main process only supervises; the worker accepts and serves).
With STREAM_SHAPES_TLS_CERT and STREAM_SHAPES_TLS_KEY set, granian serves
HTTPS with its own TLS (rustls, inside its Rust extension).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for task in tasks.iterdir() for c in (task / "children").read_text().split()]


def main() -> None:
    port = free_port()
    granian = str(Path(sys.executable).with_name("granian"))
    cert, key = os.environ.get("STREAM_SHAPES_TLS_CERT"), os.environ.get("STREAM_SHAPES_TLS_KEY")
    tls = ["--ssl-certificate", cert, "--ssl-keyfile", key] if cert and key else []
    server = subprocess.Popen(
        [granian, "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--log-level", "warning", *tls, "stream_shapes_fastapi:app"],
        cwd=Path(__file__).parent, env={**os.environ, "STREAM_SHAPES_LOG": sys.argv[1]})
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"granian did not listen on {port}")
            time.sleep(0.1)
    # The tests stop this launcher with SIGTERM, whose default action would leave granian
    # running: exit through the finally below instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    workers = children(server.pid)
    print(port, flush=True)
    print(workers[0], flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
