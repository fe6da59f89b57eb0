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
    "kernel",
    "btf",
    "tracefs",
    "libbpf",
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
def not_btf():
    # Short, space-free path: the table may fold long cells.
    fd, path = tempfile.mkstemp(prefix="ip-btf-", dir="/tmp")
    os.write(fd, b"not BTF\n")
    os.close(fd)
    yield path
    os.unlink(path)


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


def _assert_btf_failure(result: subprocess.CompletedProcess, path: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert "Traceback" not in output
    assert "✗" in row(result.stdout, "tracepoint program")
    # The unwrapped problem list below the table names the file and what libbpf found.
    problem = next(line for line in result.stdout.splitlines()
                   if line.startswith("✗ tracepoint program:"))
    assert path in problem and "BPF object format invalid" in problem, problem
    assert "Not ready" in result.stderr


@pytest.mark.bpf
@needs_root
def test_doctor_fails_cleanly_with_a_btf_file_that_is_not_btf(not_btf):
    result = run_doctor("--btf", not_btf)
    _assert_btf_failure(result, not_btf)


@pytest.mark.bpf
@needs_root
def test_doctor_fails_cleanly_with_a_btf_file_that_is_not_btf_from_the_env(not_btf):
    result = run_doctor(env_extra={"INFERPROBE_BTF": not_btf})
    _assert_btf_failure(result, not_btf)


@pytest.mark.bpf
@needs_root
def test_the_kernel_s_own_btf_given_as_a_file_works():
    result = run_doctor("--btf", "/sys/kernel/btf/vmlinux")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "✓" in row(result.stdout, "tracepoint program")
