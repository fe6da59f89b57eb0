"""Requests grouped by their process's cgroup."""

from inferprobe.analyzers.by_container import UNKNOWN_CGROUP, attach_identities, by_cgroup
from inferprobe.collector.model.process_identity import (
    ContainerInfo,
    ProcessIdentity,
    identities_from_snapshot,
)
from inferprobe.collector.model.timeline import Outcome, Request

CID = "ef" * 32


def _req(pid: int, t: int) -> Request:
    return Request(pid=pid, tid=pid, conn=t, method="POST", path="/v1/completions", t_ingress_ns=t,
                   status=200, outcome=Outcome.COMPLETE, t_end_ns=t + 100)


def test_requests_split_by_cgroup_with_their_pids_and_namespace_pids():
    identities = identities_from_snapshot({"processes": [
        ProcessIdentity(10, None, "/system.slice/api.service", None).as_json(),
        ProcessIdentity(20, 1, f"/docker/{CID}", ContainerInfo(CID, "docker")).as_json(),
        ProcessIdentity(21, 7, f"/docker/{CID}", ContainerInfo(CID, "docker")).as_json(),
    ]})
    reqs = [_req(10, 1), _req(20, 2), _req(21, 3), _req(20, 4), _req(99, 5)]
    attach_identities(reqs, identities)
    groups = by_cgroup(reqs)
    assert [(g.cgroup, g.pids, g.summary.requests) for g in groups] == [
        (f"/docker/{CID}", [20, 21], 3), ("/system.slice/api.service", [10], 1), (UNKNOWN_CGROUP, [99], 1)]
    assert groups[0].container == ContainerInfo(CID, "docker") and groups[0].ns_pids == {20: 1, 21: 7}
    assert reqs[4].process is None  # a pid the recording never read is not read now
