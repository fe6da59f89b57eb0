"""record --all's filters in user space, and --cgroup turned into what the kernel compares."""

from __future__ import annotations

import os

import pytest

from inferprobe.collector.errors import TargetProblem
from inferprobe.collector.processes import host_wide
from inferprobe.collector.processes.host_wide import Filters, make_filters, passes, resolve_cgroup


def test_cgroup_paths_resolve_to_the_directory_inode_and_depth(tmp_path):
    (tmp_path / "kubepods.slice" / "pod1").mkdir(parents=True)
    found = resolve_cgroup("/kubepods.slice/pod1", root=tmp_path)
    assert found.id == os.stat(tmp_path / "kubepods.slice" / "pod1").st_ino
    assert (found.level, found.path) == (2, "/kubepods.slice/pod1")
    # A path under the mount means the same group.
    assert resolve_cgroup(str(tmp_path / "kubepods.slice"), root=tmp_path).level == 1
    with pytest.raises(TargetProblem, match="no cgroup /missing"):
        resolve_cgroup("/missing", root=tmp_path)


def test_the_cgroup_root_can_come_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    monkeypatch.setenv("INFERPROBE_CGROUP_ROOT", str(tmp_path))
    assert resolve_cgroup("/a").id == os.stat(tmp_path / "a").st_ino


def test_bad_filters_are_one_sentence():
    with pytest.raises(TargetProblem, match="at most 16"):
        make_filters(tuple(range(1, 18)), None, None)
    with pytest.raises(TargetProblem, match="1 to 15 bytes"):
        make_filters((), "a-name-longer-than-15", None)
    assert make_filters((80, 80, 81), None, None).ports == (80, 81)


def test_passes_applies_port_name_and_cgroup(monkeypatch):
    monkeypatch.setattr(host_wide, "_comm", lambda pid: {1: "vllm", 2: "sshd"}[pid])
    monkeypatch.setattr(host_wide, "process_cgroup", lambda pid: {1: "/kubepods/pod1/c1", 2: "/system"}[pid])
    assert passes(Filters(), 2, 22)
    assert passes(Filters(ports=(8000,)), 1, 8000) and not passes(Filters(ports=(8000,)), 1, 0)
    assert passes(Filters(comm="vllm"), 1, 0) and not passes(Filters(comm="vllm"), 2, 0)
    pods = Filters(cgroup=host_wide.CgroupFilter(path="/kubepods", id=1, level=1))
    assert passes(pods, 1, 0) and not passes(pods, 2, 0)
    # A sibling whose name starts the same is not inside.
    assert not passes(Filters(cgroup=host_wide.CgroupFilter(path="/kube", id=1, level=1)), 1, 0)


def test_a_scan_finds_this_process_listening_and_not_the_scanner_itself():
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        scanner = host_wide.ListenerScan(self_pid=-1)
        serving = scanner.scan()
        assert sock.getsockname()[1] in serving.get(os.getpid(), set())
        walks = scanner.fd_walks
        scanner.scan()
        assert scanner.fd_walks == walks   # nothing new: no file descriptors walked again
        assert os.getpid() not in host_wide.ListenerScan().scan()   # the scanner's own sockets
    finally:
        sock.close()
