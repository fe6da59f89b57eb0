"""Requests split by where their process runs: one group per cgroup (a container
is one cgroup; a host process's cgroup is its systemd unit or the root).

The identities come from the recording (collector/processes/containers.py, read by
the recorder once per process); a request whose process was never read
(it came and went between two of the recorder's looks) goes under
UNKNOWN_CGROUP rather than under a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferprobe.analyzers.cadence import CadenceSummary, summarize
from inferprobe.collector.model.process_identity import ContainerInfo, ProcessIdentity
from inferprobe.collector.model.timeline import Request

UNKNOWN_CGROUP = "(unknown)"


@dataclass(frozen=True)
class CgroupGroup:
    cgroup: str  # the cgroup v2 path, or UNKNOWN_CGROUP
    container: ContainerInfo | None
    pids: list[int]  # host pids
    ns_pids: dict[int, int] = field(default_factory=dict)  # host pid -> its pid in its own namespace
    summary: CadenceSummary | None = None


def attach_identities(requests: Sequence[Request], identities: Mapping[int, ProcessIdentity]) -> None:
    """Sets each request's process identity (Request.process) from the recording's."""
    for r in requests:
        if r.process is None:
            r.process = identities.get(r.pid)


def by_cgroup(requests: Sequence[Request]) -> list[CgroupGroup]:
    """One group per cgroup, the one with most requests first, UNKNOWN_CGROUP last."""
    groups: dict[str, list[Request]] = {}
    for r in requests:
        key = r.process.cgroup if r.process is not None and r.process.cgroup is not None else UNKNOWN_CGROUP
        groups.setdefault(key, []).append(r)
    out = []
    for cgroup, reqs in groups.items():
        procs = {r.pid: r.process for r in reqs}
        container = next((p.container for p in procs.values() if p is not None and p.container), None)
        out.append(CgroupGroup(cgroup=cgroup, container=container, pids=sorted(procs),
                               ns_pids={pid: p.ns_pid for pid, p in procs.items()
                                        if p is not None and p.ns_pid is not None},
                               summary=summarize(reqs)))
    return sorted(out, key=lambda g: (g.cgroup == UNKNOWN_CGROUP, -g.summary.requests if g.summary else 0,
                                      g.cgroup))
