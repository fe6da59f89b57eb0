"""The demo command's one-line errors (the load generator against the real server: tests/integration/demo)."""

from __future__ import annotations

import socket
import subprocess
import sys


def _one_line_error(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_busy_port_is_one_clear_error():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "demo", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    _one_line_error(proc, f"port {port} on 127.0.0.1 is already in use")


def test_load_without_a_server_is_one_clear_error():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    proc = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "demo", "--load", "1", "--count", "1",
                           "--url", f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    _one_line_error(proc, "no request completed")


def test_load_options_without_load():
    proc = subprocess.run([sys.executable, "-m", "inferprobe.cli.main", "demo", "--count", "3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    _one_line_error(proc, "--count only applies with --load N")
