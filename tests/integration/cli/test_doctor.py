"""`inferprobe doctor` against the real kernel."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from tests.support.cli import run_doctor
from tests.support.kernel import needs_root

CHECK_NAMES = [
    "privileges",
    "bpf syscall",
    "btf",
    "tracefs",
    "kernel headers",
    "bcc",
    "tracepoint program",
    "uprobes",
    "usdt",
]


def row(output: str, name: str) -> str:
    """The table line that starts the row for check `name`."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == name:
            return line
    raise AssertionError(f"no table row for {name!r} in:\n{output}")


@pytest.fixture
def empty_headers_dir():
    # Short, space-free path: the table may fold long cells.
    path = tempfile.mkdtemp(prefix="ip-hdr-", dir="/tmp")
    yield path
    os.rmdir(path)


@pytest.mark.bpf
@needs_root
def test_doctor_passes_on_this_host():
    result = run_doctor()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    for name in CHECK_NAMES:
        assert "✓" in row(result.stdout, name), f"{name} did not pass:\n{output}"
    assert "Ready:" in result.stdout


def _assert_headers_failure(result: subprocess.CompletedProcess, directory: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert "Traceback" not in output
    assert "✗" in row(result.stdout, "kernel headers")
    # The unwrapped problem list below the table names the dir and the fix.
    problem = next(line for line in result.stdout.splitlines()
                   if line.startswith("✗ kernel headers:"))
    assert directory in problem
    assert "holds no kernel headers" in problem
    fix_line = result.stdout.splitlines()[result.stdout.splitlines().index(problem) + 1]
    assert fix_line.strip().startswith("fix:")
    assert "make setup" in fix_line
    assert "Not ready" in result.stderr


@pytest.mark.bpf
@needs_root
def test_doctor_fails_cleanly_with_empty_headers_flag(empty_headers_dir):
    result = run_doctor("--kernel-headers", empty_headers_dir)
    _assert_headers_failure(result, empty_headers_dir)


@pytest.mark.bpf
@needs_root
def test_doctor_fails_cleanly_with_empty_headers_env(empty_headers_dir):
    result = run_doctor(env_extra={"INFERPROBE_KERNEL_HEADERS": empty_headers_dir})
    _assert_headers_failure(result, empty_headers_dir)
