"""`inferprobe doctor -p PID` names rustls, the TLS a Rust binary or extension links in.

rustls has no library of its own: it is compiled into each Rust program
that uses it, usually stripped, so no symbol names it. A granian worker
serving HTTPS (its TLS is rustls, in granian's Rust extension) also maps
Python's libssl, which doctor used to give as the answer although none of
the worker's connections go through it. And hf_xet (Hugging Face's Xet
storage client, a Rust extension huggingface_hub downloads through) links
rustls the same way. A Python process that maps only libssl names no rustls.
A Rust server that keeps its symbols (tests/programs/rustls_sse, hyper on
tokio-rustls) has its rustls hooked, and doctor says so.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import run_doctor
from tests.support.kernel import needs_root
from tests.support.paths import SERVERS
from tests.support.processes import stop_process
from tests.support.rust import start_rustls_server
from tests.support.tls import self_signed_certificate

pytestmark = needs_root

RUSTLS_LINE = re.compile(r"! TLS: rustls (\d+\.\d+\.\d+) linked into (\S+?):")


def tls_lines(pid: int) -> list[str]:
    result = run_doctor("-p", str(pid))
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if " TLS: " in line]


@pytest.fixture
def granian_tls_worker(tmp_path: Path):
    if not (Path(sys.executable).parent / "granian").exists():
        pytest.skip("granian is not installed (the test extra installs it)")
    env = {**self_signed_certificate(tmp_path), "PATH": "/usr/bin:/bin"}
    launcher = [sys.executable, str(SERVERS / "stream_shapes_granian.py"), str(tmp_path / "log")]
    server = subprocess.Popen(launcher, stdout=subprocess.PIPE, text=True, env=env)
    try:
        server.stdout.readline()   # the port
        yield int(server.stdout.readline())
    finally:
        stop_process(server)


def python_importing(module: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"import {module}, sys; print('ready', flush=True); "
                             "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_granian_https_worker_is_named_as_rustls_not_openssl(granian_tls_worker):
    lines = tls_lines(granian_tls_worker)
    rustls = [m for line in lines if (m := RUSTLS_LINE.search(line))]
    assert len(rustls) == 1, lines
    assert "granian" in rustls[0].group(2)
    # rustls leads: the libssl the worker maps is not what its connections use
    assert RUSTLS_LINE.search(lines[0]), lines


def test_hf_xet_is_named_as_rustls():
    pytest.importorskip("hf_xet")
    proc = python_importing("hf_xet")
    try:
        lines = tls_lines(proc.pid)
    finally:
        stop_process(proc)
    assert any((m := RUSTLS_LINE.search(line)) and "hf_xet" in m.group(2) for line in lines), lines


def test_a_process_with_only_openssl_names_no_rustls():
    proc = python_importing("ssl")
    try:
        lines = tls_lines(proc.pid)
    finally:
        stop_process(proc)
    assert lines and not any("rustls" in line for line in lines), lines
    assert any("OpenSSL" in line for line in lines), lines


def test_a_rust_server_that_keeps_its_symbols_has_its_rustls_hooked(tmp_path):
    server, _ = start_rustls_server(tmp_path, tmp_path / "log")   # listening
    try:
        lines = tls_lines(server.pid)
    finally:
        stop_process(server)
    assert len(lines) == 1, lines
    assert re.search(r"✓ TLS: rustls (\d+\.\d+\.\d+ )?compiled into \S+/rustls_sse_server, with its symbols: "
                     r"hooks Reader::read and Writer::write", lines[0]), lines
