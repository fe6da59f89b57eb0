"""Containers as the kernel sees them: a process's cgroup, and what its path names.

A container is no kernel object. What the kernel keeps is a process's
cgroup (/proc/PID/cgroup) and its pid namespaces (NSpid in
/proc/PID/status). Container runtimes and the kubelet name the cgroups
they make after the container and the pod, so the path is where the
container id, the pod UID and the pod's QoS class can be read back:

    docker (cgroupfs driver)       /docker/<id>
    docker (systemd driver)        /system.slice/docker-<id>.scope
    podman                         /machine.slice/libpod-<id>.scope
    kubepods, cgroupfs driver      /kubepods/burstable/pod<uid>/<id>
                                   /kubepods/pod<uid>/<id>                  (guaranteed)
    kubepods, systemd driver       /kubepods.slice/kubepods-besteffort.slice/
                                     kubepods-besteffort-pod<uid_with_underscores>.slice/
                                     cri-containerd-<id>.scope              (or crio-<id>, docker-<id>)

<id> is 64 hex digits. A path that matches none of these (a systemd
service, a user session) names no container, which is no error.

On a hybrid host (cgroup v1 controllers plus the v2 `unified` hierarchy,
as on this project's test machines) the v2 line ("0::") is the cgroup the
report shows, and bpf_get_current_cgroup_id() returns that group's id;
a runtime that makes only v1 groups leaves the v2 path without the
container's name, so the v1 paths are looked at for it too.

Read once per process (ProcessIdentities); only user space reads these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from inferprobe.collector.model.process_identity import (
    ContainerInfo,
    ProcessIdentity,
    identities_from_snapshot,
)

PROC = Path("/proc")
MAX_PROCESSES = 65536  # identities kept; the oldest read goes first

_ID = r"[0-9a-f]{64}"
# A runtime's scope unit (systemd driver) or a bare id directory (cgroupfs driver).
_SCOPE = re.compile(rf"(?:^|/)(docker|cri-containerd|crio|libpod)-({_ID})\.scope(?:/|$)")
_BARE = re.compile(rf"(?:^|/)({_ID})(?:/|$)")
_DOCKER_DIR = re.compile(rf"(?:^|/)docker/({_ID})(?:/|$)")
_RUNTIMES = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman"}
# The pod's cgroup: kubepods[/<qos>]/pod<uid> or kubepods[-<qos>]-pod<uid_with_underscores>.slice
_POD_CGROUPFS = re.compile(r"(?:^|/)kubepods/(?:(burstable|besteffort)/)?pod([0-9a-f_-]{36})(?:/|$)")
_POD_SYSTEMD = re.compile(r"kubepods(?:-(burstable|besteffort))?-pod([0-9a-f_]{36})\.slice(?:/|$)")


def parse_cgroup_path(path: str) -> ContainerInfo | None:
    """What a cgroup path names: a container and, under Kubernetes, its pod; None for neither."""
    container_id = runtime = None
    scope = _SCOPE.search(path)
    if scope is not None:
        runtime, container_id = _RUNTIMES[scope.group(1)], scope.group(2)
    else:
        docker = _DOCKER_DIR.search(path)
        bare = docker or _BARE.search(path)
        if bare is not None:
            container_id = bare.group(1)
            runtime = "docker" if docker is not None else None
    pod_uid = qos = None
    pod = _POD_CGROUPFS.search(path) or _POD_SYSTEMD.search(path)
    if pod is not None:
        qos = pod.group(1) or "guaranteed"
        pod_uid = pod.group(2).replace("_", "-")
    if container_id is None and pod_uid is None:
        return None
    return ContainerInfo(container_id=container_id, runtime=runtime, pod_uid=pod_uid, qos_class=qos)


def parse_proc_cgroup(text: str) -> tuple[str | None, ContainerInfo | None]:
    """/proc/PID/cgroup: the v2 path ("0::" line; None on a v1-only host) and the
    container it names, or (hybrid hosts) the first v1 path that names one."""
    v2 = None
    v1: list[str] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        _controllers, _, path = rest.partition(":")
        if hierarchy == "0":
            v2 = path
        elif path:
            v1.append(path)
    for candidate in ([v2] if v2 else []) + v1:
        info = parse_cgroup_path(candidate)
        if info is not None:
            return v2, info
    return v2, None


def parse_ns_pids(status_text: str) -> tuple[int, ...]:
    """NSpid of /proc/PID/status: the pid in each pid namespace, the host's first,
    the process's own namespace last (one entry: it is in the host's)."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(p) for p in line.split()[1:])
    return ()


def read_identity(pid: int, proc: Path = PROC) -> ProcessIdentity | None:
    """pid's identity now; None when it is gone."""
    try:
        cgroup_text = (proc / str(pid) / "cgroup").read_text()
        status_text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    cgroup, info = parse_proc_cgroup(cgroup_text)
    ns = parse_ns_pids(status_text)
    return ProcessIdentity(pid=pid, ns_pid=ns[-1] if len(ns) > 1 else None, cgroup=cgroup, container=info)


class ProcessIdentities:
    """Each traced process's identity, read once (at its first sight) and kept
    after it exits, so a recording can say where its requests ran."""

    def __init__(self, proc: Path | None = PROC) -> None:
        self._proc = proc  # None: a recording's, read back; nothing is read from /proc
        self._known: dict[int, ProcessIdentity | None] = {}

    def note(self, pids: Iterable[int]) -> None:
        if self._proc is None:
            return
        for pid in pids:
            if pid not in self._known:
                self._known[pid] = read_identity(pid, self._proc)
                if len(self._known) > MAX_PROCESSES:  # an agent's days of short-lived processes
                    del self._known[next(iter(self._known))]

    def get(self, pid: int) -> ProcessIdentity | None:
        self.note([pid])
        return self._known.get(pid)

    def snapshot(self) -> dict:
        """For the recording (RecordingWriter.add_snapshot("processes", ...))."""
        return {"processes": [i.as_json() for i in self._known.values() if i is not None]}

    @classmethod
    def from_snapshot(cls, data: dict | None) -> ProcessIdentities:
        """A recording's identities; a pid it does not list stays unknown (never read now)."""
        ids = cls(proc=None)
        ids._known.update(identities_from_snapshot(data))
        return ids


def any_in_container(pids: Iterable[int], proc: Path = PROC) -> bool:
    """Whether one of pids runs in a container (or a Kubernetes pod) now."""
    return any((i := read_identity(pid, proc)) is not None and i.container is not None for pid in pids)
