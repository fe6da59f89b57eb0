"""The report model: everything `report` shows, computed once from a recording.

Every analyzer runs here, once, and its result is kept in the ReportData
(never written into the Request timelines). The renderers in reports/
(terminal, HTML, Markdown, JSON) and the replaying exporters only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferprobe.analyzers import client_calls, no_requests, proxy_hops, unread_traffic, verdict
from inferprobe.analyzers import locks as lock_analysis
from inferprobe.analyzers import network as network_analysis
from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.batching import BatchingAdvice, Target, advise
from inferprobe.analyzers.breakdown import Breakdown, break_down
from inferprobe.analyzers.by_container import CgroupGroup, attach_identities, by_cgroup
from inferprobe.analyzers.cadence import CadenceSummary, by_endpoint, by_model, summarize
from inferprobe.analyzers.engine_metrics import EngineMetricsSummary
from inferprobe.analyzers.engine_metrics_ttft import summary_of as engine_metrics_of
from inferprobe.analyzers.findings import Finding, FindingList
from inferprobe.analyzers.gpu import GpuSummary, summarize_gpu
from inferprobe.analyzers.proxy_hops import ProxyHops, Tie
from inferprobe.analyzers.registry import FINDERS
from inferprobe.analyzers.request_analysis import RequestAnalysis, per_request
from inferprobe.analyzers.scheduler import SchedulerSummary, stall_ns_by_request, summarize_scheduler
from inferprobe.analyzers.timeseries import TimeSeries, over_time
from inferprobe.analyzers.ttft_percentiles import (
    AtTtftPercentile,
    decomposition,
    requests_at_ttft_percentiles,
)
from inferprobe.collector.ingest.pipeline import ingest
from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.events import GpuRecord, UsdtRecord
from inferprobe.collector.model.process_identity import identities_from_snapshot
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.timeline import Connection, Request, SessionStats


@dataclass(frozen=True)
class ReportData:
    recording: Recording
    requests: list[Request]
    overall: CadenceSummary
    endpoints: dict[str, CadenceSummary]
    session: SessionStats
    connections: list[Connection]
    undecodable_events: int
    server: ServerView
    scheduler: SchedulerSummary
    correlated: int  # requests tied to the server's own (USDT) view of them
    stall_ns: dict[tuple[int, int], int]  # (pid, req_id) -> time spent in stalled batches
    decomposition: dict[int, AtTtftPercentile]  # percentile -> the request at that TTFT percentile
    network: list[network_analysis.ConnectionNetwork]  # per connection, from the network set
    # What the findings beyond the core ones were found in (analyzers/registry.py), and what the
    # report's analyzer sections are built from (reports/sections/registry.py).
    analysis_input: AnalysisInput
    network_findings: list[Finding] = field(default_factory=list)  # per connection, unranked
    per_request: list[RequestAnalysis] = field(default_factory=list)  # aligned with requests
    # the HTML/Markdown report (reports/): phase split drawn, series, verdict
    breakdown: Breakdown | None = None
    series: TimeSeries | None = None
    findings: list[Finding] = field(default_factory=list)  # ranked, largest share first
    locks: lock_analysis.LockAnalysis | None = None
    gpu: GpuSummary | None = None  # None without the gpu probe set
    models: dict[str, CadenceSummary] = field(default_factory=dict)  # by the request body's "model"
    no_requests: str | None = None  # why the recording holds no request (analyzers/no_requests.py)
    unread_connections: int = 0  # connections whose bytes nothing recognised (analyzers/unread_traffic.py)
    unread_traffic: str | None = None  # the same, as the sentence the report prints
    local_ipc_connections: int = 0  # Unix-socket connections that carried no HTTP (unread_traffic.py)
    tls_connections_without_plaintext: int = 0  # TLS handshakes only, nothing unread (unread_traffic.py)
    self_pair_ends: int = 0  # a socketpair's ends one target holds (asyncio's self-pipe): no IPC
    local_ipc: str | None = None  # the same, as a note
    # The targets' outbound calls, their attempts grouped (analyzers/client_calls.py).
    client_calls: list[client_calls.ClientCall] = field(default_factory=list)
    engine_metrics: EngineMetricsSummary | None = None  # the engine's own /metrics (record --engine-metrics)
    cgroups: list[CgroupGroup] = field(default_factory=list)  # requests by their process's cgroup
    # The engine's step-time model and the what-if sweep of its batch cap (analyzers/batching.py);
    # None where no engine step timeline was recorded.
    batching: BatchingAdvice | None = None
    # A traced proxy in front of a traced backend: the connections tying the hops
    # (analyzers/proxy_hops.py); the headline counts each client request once, at the hop
    # that served the user.
    proxy_hops: ProxyHops | None = None

    @property
    def hop_ties(self) -> list[Tie]:
        return list(self.proxy_hops.ties) if self.proxy_hops is not None else []

    @property
    def headline_requests(self) -> list[Request]:
        """The requests the headline numbers (overall) summarize: headline_of(requests)."""
        return headline_of(self.requests, self.hop_ties)

    @property
    def probe_sets(self) -> dict:
        sets = self.recording.meta.probe_sets
        return {"active": dict(sets.active), "inactive": dict(sets.inactive)}

    @property
    def lost_events(self) -> int:
        return self.recording.lost_events


def headline_of(requests: list[Request], hop_ties: list[Tie] | None = None) -> list[Request]:
    """The headline numbers, per endpoint, model and container are the requests served to
    users: a target's outbound calls (an engine's own OTLP exports, say) are in the client
    view, and a backend's requests from a traced proxy are the proxy's requests again (in
    its hops section). A process that only calls out (an application traced as a client)
    has its calls as them."""
    return proxy_hops.user_facing(requests, hop_ties or []) or requests


def scraper_connections(requests: list[Request], connections: dict[int, Connection],
                        summary: EngineMetricsSummary) -> set[int]:
    """The connections the recorder itself opened to scrape the engine's metrics,
    told by the scraper's own socket: the server's peer is the scraper's local port.
    Never by what they carried: another client's GET of the same path is traffic
    like any other. The peer is known for every connection accepted while recording
    (at accept, or at its first read where the accept took no address)."""
    return {r.conn for r in requests
            if (conn := connections.get(r.conn)) is not None and conn.peer_port in summary.scraper_ports}


def without_scrapes(requests: list[Request], connections: dict[int, Connection],
                    summary: EngineMetricsSummary) -> list[Request]:
    """The requests except the recorder's own scrapes of the engine's metrics."""
    own = scraper_connections(requests, connections, summary)
    return [r for r in requests if r.conn not in own]


def build(recording: Recording, mutex_threshold: float = lock_analysis.DEFAULT_MUTEX_THRESHOLD,
          target: Target | None = None, current_setting: int | None = None) -> ReportData:
    """The report model. `target` and `current_setting` are `advise`'s: the latency target the
    batching sweep chooses a setting for, and the batch cap the recording ran at where the
    user knows it better than the recording shows."""
    ingested = ingest(recording.events)
    decoded, requests, server = ingested.events, ingested.requests, ingested.server
    engine_metrics = engine_metrics_of(recording)
    if engine_metrics is not None:  # the recorder's own scrapes are no traffic of the server's
        requests = without_scrapes(requests, ingested.connections, engine_metrics)
    # Where each request's process ran, as the recorder read it (collector/processes/containers.py).
    attach_identities(requests, identities_from_snapshot(recording.snapshots.get("processes")))
    usdt = [ev for ev in decoded if isinstance(ev, UsdtRecord)]
    scheduler = summarize_scheduler(server)
    locks = lock_analysis.analyze(requests, decoded, recording.snapshots.get("locks"), mutex_threshold,
                                  steps=server.steps)
    network = network_analysis.analyze(decoded, list(ingested.connections.values()),
                                       recording.snapshots.get("network"))
    final = recording.final or {}
    gpu = summarize_gpu(
        [ev for ev in decoded if isinstance(ev, GpuRecord)], recording.snapshots.get("gpu"), requests,
        server.steps, int(final["duration_s"] * 1e9) if "duration_s" in final else None,
        recording.meta.probe_sets.active.get("gpu"))
    network_findings = network_analysis.findings(network)
    calls = client_calls.group(requests, ingested.connections)
    hops = proxy_hops.analyze(requests, ingested.connections.values(), recording.meta.target_names)
    hop_ties = list(hops.ties) if hops is not None else []
    # The server-side verdicts (where a served request's time went) read served requests
    # only: a client's outbound call spends that time in its peer (analyzers/client_calls.py),
    # and a proxy's request in its backend (analyzers/proxy_hops.py, whose finding is the proxy's).
    served = proxy_hops.engine_side(requests, hop_ties)
    headline = headline_of(requests, hop_ties)
    at_ttft = requests_at_ttft_percentiles(served)
    breakdown = break_down(served, at_ttft)
    series = over_time(served, usdt, recording.meta.started_monotonic_ns)
    active_sets = recording.meta.probe_sets.active
    findings = FindingList(verdict.core_findings(served, breakdown, series, active_sets, engine_metrics))
    batching = advise(server, requests, target, current_setting) if server.steps else None
    inp = AnalysisInput(recording=recording, requests=requests, events=decoded, locks=locks,
                        network=network, network_findings=network_findings, gpu=gpu, client_calls=calls,
                        batching=batching, proxy_hops=hops, engine_metrics=engine_metrics)
    for find in FINDERS:
        findings.extend(find(inp))
    return ReportData(
        recording=recording,
        requests=requests,
        overall=summarize(headline),
        endpoints={ep: summarize(reqs) for ep, reqs in by_endpoint(headline).items()},
        models={m: summarize(reqs) for m, reqs in by_model(headline).items()},
        cgroups=by_cgroup(headline),
        no_requests=no_requests.explain(recording, requests, list(ingested.connections.values())),
        unread_connections=unread_traffic.unread_connections(recording),
        unread_traffic=unread_traffic.sentence(recording),
        local_ipc_connections=unread_traffic.local_ipc_connections(recording),
        tls_connections_without_plaintext=unread_traffic.tls_without_plaintext(recording),
        self_pair_ends=unread_traffic.self_pair_ends(recording),
        local_ipc=unread_traffic.local_ipc_sentence(recording),
        session=ingested.session,
        connections=sorted(ingested.connections.values(), key=lambda c: c.conn_id),
        undecodable_events=ingested.undecodable,
        server=server,
        scheduler=scheduler,
        correlated=ingested.correlated,
        stall_ns=stall_ns_by_request(scheduler.stalls),
        decomposition=decomposition(at_ttft),
        network=network,
        network_findings=network_findings,
        per_request=per_request(requests, locks, gpu, client_calls.attempts_by_request(calls)),
        client_calls=calls,
        breakdown=breakdown,
        series=series,
        analysis_input=inp,
        findings=findings.ranked(),
        locks=locks,
        gpu=gpu,
        engine_metrics=engine_metrics,
        batching=batching,
        proxy_hops=hops,
    )
