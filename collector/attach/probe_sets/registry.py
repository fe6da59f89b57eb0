"""Every probe set `record` can turn on, by name, in the order they load."""

from __future__ import annotations

from inferprobe.collector.attach.probe_sets import ProbeSet
from inferprobe.collector.attach.probe_sets.gpu import GpuProbes
from inferprobe.collector.attach.probe_sets.host_wide import HostWideProbes
from inferprobe.collector.attach.probe_sets.llama import LlamaProbes
from inferprobe.collector.attach.probe_sets.locks import LockProbes
from inferprobe.collector.attach.probe_sets.network import NetworkProbes
from inferprobe.collector.attach.probe_sets.sockets import SocketProbes
from inferprobe.collector.attach.probe_sets.stacks import OffcpuProbes, ProfileProbes
from inferprobe.collector.attach.probe_sets.tls import TlsProbes
from inferprobe.collector.attach.probe_sets.usdt import UsdtProbes


def available_sets() -> dict[str, type[ProbeSet]]:
    # sockets first: the TLS set loads into the chain the sockets set set up.
    return {cls.name: cls for cls in (SocketProbes, TlsProbes, UsdtProbes, NetworkProbes, ProfileProbes,
                                      OffcpuProbes, LockProbes, GpuProbes, LlamaProbes, HostWideProbes)}
