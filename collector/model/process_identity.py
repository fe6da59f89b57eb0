"""Where a process runs, as a recording keeps it: its cgroup, pid namespace and container.

The record types only: collector/processes/containers.py reads them from
/proc while recording (and says how a cgroup path names a container), a
recording keeps them as its "processes" snapshot, and the report, metrics
and spans split requests by them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    container_id: str | None  # 64 hex digits
    runtime: str | None  # docker, containerd, cri-o, podman; None where the path does not say
    pod_uid: str | None = None  # Kubernetes: the pod's UID, with dashes
    qos_class: str | None = None  # Kubernetes: guaranteed, burstable or besteffort



@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Where a process runs, as the report, metrics and spans split by it."""

    pid: int  # the host's pid
    ns_pid: int | None  # its pid in its own pid namespace, when that is not the host's
    cgroup: str | None  # its cgroup v2 path
    container: ContainerInfo | None

    def as_json(self) -> dict:
        return {"pid": self.pid, "ns_pid": self.ns_pid, "cgroup": self.cgroup,
                **(asdict(self.container) if self.container else
                   {"container_id": None, "runtime": None, "pod_uid": None, "qos_class": None})}

    @classmethod
    def from_json(cls, data: dict) -> ProcessIdentity:
        info = ContainerInfo(container_id=data.get("container_id"), runtime=data.get("runtime"),
                             pod_uid=data.get("pod_uid"), qos_class=data.get("qos_class"))
        has = info.container_id is not None or info.pod_uid is not None
        return cls(pid=int(data["pid"]), ns_pid=data.get("ns_pid"), cgroup=data.get("cgroup"),
                   container=info if has else None)


def identities_from_snapshot(data: dict | None) -> dict[int, ProcessIdentity]:
    """A recording's "processes" snapshot, by host pid; a pid it does not list stays unknown."""
    identities = (ProcessIdentity.from_json(entry) for entry in (data or {}).get("processes", []))
    return {i.pid: i for i in identities}
