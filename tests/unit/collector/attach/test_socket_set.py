"""Where the socket set keeps per-thread syscall state (bpf/sock.bpf.c)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferprobe.collector.attach.preflight import BTF_VMLINUX, check_btf
from inferprobe.collector.attach.probe_sets import TargetContext
from inferprobe.collector.attach.probe_sets.sockets import (
    SocketProbes,
    sock_object_usable,
    task_pt_regs_usable,
    task_storage_usable,
)

HAVE_BTF = Path(BTF_VMLINUX).exists()


@pytest.mark.parametrize(("release", "new_enough"), [
    ("4.18.0-553.el8_10.x86_64", False),  # RHEL 8
    ("5.10.0-30-amd64", False),           # Debian 11
    ("5.12.19", False),
    ("5.13.0-rc1", True),                 # task storage reached tracing programs in 5.13
    ("5.15.0-105-generic", True),         # Ubuntu 22.04
    ("6.18.0", True),
    ("not-a-version", False),
])
def test_task_storage_needs_linux_5_13_and_btf(release, new_enough):
    assert task_storage_usable(release) is (new_enough and HAVE_BTF)


@pytest.mark.parametrize(("release", "new_enough"), [
    ("5.14.21", False),   # task storage, but no bpf_task_pt_regs yet
    ("5.15.0-105-generic", True),
    ("6.18.0", True),
])
def test_rebuilding_syscalls_under_way_needs_linux_5_15(release, new_enough):
    expected = new_enough and HAVE_BTF and os.uname().machine == "x86_64"
    assert task_pt_regs_usable(release) is expected


@pytest.mark.parametrize(("release", "new_enough"), [
    ("5.15.0-105-generic", False),   # the saved registers, but no bpf_loop yet
    ("5.16.20", False),
    ("5.17.0", True),
    ("6.18.0", True),
])
def test_the_task_storage_object_needs_linux_5_17_for_its_bpf_loop_scans(release, new_enough):
    expected = new_enough and HAVE_BTF and os.uname().machine == "x86_64"
    assert sock_object_usable(release) is expected
    # The task-storage object reads the saved registers and calls bpf_loop:
    # chosen only where the kernel has both.
    probes = SocketProbes()
    probes.prepare(TargetContext(pids=[1]))
    assert (probes.core_object == "sock.bpf.o") is sock_object_usable()


def test_the_hash_fallback_can_be_forced_and_is_then_watched_for_leaks():
    forced = SocketProbes()
    forced.prepare(TargetContext(pids=[1], options={"sockets": {"pending": "hash"}}))
    assert forced.core_object == "sock_hash.bpf.o" and "pending" in forced.state_maps

    auto = SocketProbes()
    auto.prepare(TargetContext(pids=[1]))
    assert auto.pending_in_task_storage is sock_object_usable()
    assert ("pending" in auto.state_maps) is not auto.pending_in_task_storage


def test_doctor_says_where_thread_state_lives_and_whether_blocked_reads_are_rebuilt():
    detail = check_btf().detail
    assert ("state in task-local storage;" in detail) is task_storage_usable()
    assert ("blocked at attach is rebuilt" in detail) is sock_object_usable()


def test_kernels_without_the_bpf_ring_buffer_are_refused_in_one_sentence():
    from inferprobe.collector.attach.kernel_version import ensure_kernel_version
    from inferprobe.collector.errors import EnvironmentProblem

    ensure_kernel_version("5.8.0")
    ensure_kernel_version("6.18.44-fc-v1147")
    with pytest.raises(EnvironmentProblem, match=r"^Linux 5\.4\.0-150-generic is older than 5\.8, .*ring"):
        ensure_kernel_version("5.4.0-150-generic")
