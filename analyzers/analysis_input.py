"""What report_data.build hands every finder (analyzers/registry.py) and every
report section (reports/sections/): the recording, its requests and events,
and the results of the analyzers that run first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferprobe.collector.model.events import Event
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.timeline import Request

if TYPE_CHECKING:
    from inferprobe.analyzers.batching import BatchingAdvice
    from inferprobe.analyzers.client_calls import ClientCall
    from inferprobe.analyzers.engine_metrics import EngineMetricsSummary
    from inferprobe.analyzers.findings import Finding
    from inferprobe.analyzers.gpu import GpuSummary
    from inferprobe.analyzers.locks import LockAnalysis
    from inferprobe.analyzers.network import ConnectionNetwork
    from inferprobe.analyzers.proxy_hops import ProxyHops


@dataclass(frozen=True)
class AnalysisInput:
    recording: Recording
    requests: Sequence[Request]  # sorted by ingress
    events: Sequence[Event]  # every decodable event, in recording order
    # Results of the analyzers that report_data.build runs first
    # (None when the recording has nothing for them).
    locks: LockAnalysis | None = None
    network: list[ConnectionNetwork] | None = None
    network_findings: Sequence[Finding] = ()  # analyzers/network.py's, once for every output
    gpu: GpuSummary | None = None
    client_calls: Sequence[ClientCall] = ()  # analyzers/client_calls.py: the targets' outbound calls
    batching: BatchingAdvice | None = None  # analyzers/batching.py: None without an engine step timeline
    proxy_hops: ProxyHops | None = None  # analyzers/proxy_hops.py: None without a traced proxy + backend
    # the engine's own /metrics as scraped (engine_metrics_ttft.summary_of): None without scrapes
    engine_metrics: EngineMetricsSummary | None = None
