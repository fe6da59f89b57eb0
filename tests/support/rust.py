"""The tests' Rust programs (tests/programs/rustls_sse: a hyper server and a ureq client,
rustls compiled into each), built once into a cache by their own build script, which
make setup runs too; or the test is skipped saying why."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.paths import PROGRAMS
from tests.support.tls import self_signed_certificate

BUILD = PROGRAMS / "rustls_sse" / "build.sh"
NOT_INSTALLED = 3   # build.sh's exit when Rust or Debian's crates are missing


def rustls_program(name: str) -> Path:
    """rustls_sse_server or rustls_sse_client, built if the cache lacks this version of them."""
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900)
    if done.returncode == NOT_INSTALLED:
        pytest.skip(f"{done.stderr.strip()}: make setup installs it")
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD} failed: {done.stderr[-2000:]}")
    return Path(done.stdout.split()[-1]) / name


def start_rustls_server(tmp_path: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """rustls_sse_server over HTTPS with a certificate made in tmp_path, logging to log;
    (the process, its port) once it listens. The caller stops it (stop_process)."""
    env = {**self_signed_certificate(tmp_path), "PATH": "/usr/bin:/bin"}
    server = subprocess.Popen([str(rustls_program("rustls_sse_server")), str(log)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        return server, int(server.stdout.readline())
    except ValueError:   # it exited before listening
        server.kill()
        raise
