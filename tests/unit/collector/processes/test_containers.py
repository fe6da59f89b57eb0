"""Container ids, pod UIDs and QoS classes from real-shaped cgroup paths."""

import pytest

from inferprobe.collector.model.process_identity import ContainerInfo, ProcessIdentity
from inferprobe.collector.processes.containers import (
    ProcessIdentities,
    parse_cgroup_path,
    parse_ns_pids,
    parse_proc_cgroup,
    read_identity,
)

CID = "3f2b6c0a9d8e7f61524334251607a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5"
UID = "8d2f6e4a-1b3c-4d5e-9f60-7a8b9c0d1e2f"
UID_SYSTEMD = UID.replace("-", "_")


@pytest.mark.parametrize("path, expected", [
    (f"/docker/{CID}", ContainerInfo(CID, "docker")),
    (f"/system.slice/docker-{CID}.scope", ContainerInfo(CID, "docker")),
    (f"/machine.slice/libpod-{CID}.scope", ContainerInfo(CID, "podman")),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container",
     ContainerInfo(CID, "podman")),
    (f"/kubepods/burstable/pod{UID}/{CID}", ContainerInfo(CID, None, UID, "burstable")),
    (f"/kubepods/besteffort/pod{UID}/{CID}", ContainerInfo(CID, None, UID, "besteffort")),
    (f"/kubepods/pod{UID}/{CID}", ContainerInfo(CID, None, UID, "guaranteed")),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/"
     f"cri-containerd-{CID}.scope", ContainerInfo(CID, "containerd", UID, "burstable")),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/crio-{CID}.scope",
     ContainerInfo(CID, "cri-o", UID, "besteffort")),
    (f"/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/docker-{CID}.scope",
     ContainerInfo(CID, "docker", UID, "guaranteed")),
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     f"kubelet-kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope",
     ContainerInfo(CID, "containerd", UID, "burstable")),
    # the pod's own cgroup (its pause sandbox's parent): a pod, no container
    (f"/kubepods/burstable/pod{UID}", ContainerInfo(None, None, UID, "burstable")),
])
def test_runtime_and_kubelet_paths(path, expected):
    assert parse_cgroup_path(path) == expected


@pytest.mark.parametrize("path", [
    "/", "/system.slice/ssh.service", "/user.slice/user-0.slice/session-3.scope",
    "/process_api/bb4955559142746e8703cbd36286a73c",  # 32 hex digits: no container id
    f"/system.slice/docker-{CID[:-1]}.scope",
])
def test_paths_that_name_no_container(path):
    assert parse_cgroup_path(path) is None


def test_hybrid_host_v2_path_is_the_cgroup_and_v1_paths_may_name_the_container():
    text = (f"12:memory:/docker/{CID}\n11:pids:/docker/{CID}\n1:name=systemd:/docker/{CID}\n"
            "0::/system.slice/containerd.service\n")
    cgroup, info = parse_proc_cgroup(text)
    assert cgroup == "/system.slice/containerd.service"
    assert info == ContainerInfo(CID, "docker")
    assert parse_proc_cgroup("0::/inferprobe-test/srv\n") == ("/inferprobe-test/srv", None)
    assert parse_proc_cgroup("4:memory:/x\n")[0] is None  # v1 only


def test_ns_pids():
    assert parse_ns_pids("Name:\tx\nNSpid:\t4242\t1\n") == (4242, 1)
    assert parse_ns_pids("NSpid:\t77\n") == (77,)
    assert parse_ns_pids("Name:\told kernel\n") == ()


def test_identities_read_once_and_survive_in_a_recording(tmp_path):
    (tmp_path / "50").mkdir()
    (tmp_path / "50" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    (tmp_path / "50" / "status").write_text("NSpid:\t50\t7\n")
    ids = ProcessIdentities(proc=tmp_path)
    ids.note([50, 51])  # 51 does not exist
    (tmp_path / "50" / "cgroup").write_text("0::/moved\n")
    first = ids.get(50)
    assert first == ProcessIdentity(50, 7, f"/kubepods/besteffort/pod{UID}/{CID}",
                                    ContainerInfo(CID, None, UID, "besteffort"))
    assert ids.get(51) is None
    back = ProcessIdentities.from_snapshot(ids.snapshot())
    assert back.get(50) == first and back.get(51) is None


def test_this_process():
    me = read_identity(__import__("os").getpid())
    assert me is not None and me.cgroup is not None and me.cgroup.startswith("/")
