"""Prometheus metrics for finished requests and the server's USDT gauges.

Names: the OpenTelemetry GenAI server metrics where they exist
(gen_ai.server.* become gen_ai_server_*_seconds, with the bucket boundaries
the GenAI conventions recommend), the design card's own names for the
scheduler gauges (labelled by their source: the server's USDT probes or the
engine's own /metrics), and inferprobe_* for the rest. Labels are endpoint
("METHOD /path", capped at MAX_ENDPOINTS distinct values, the rest
"other"), model (the request body's "model", capped at MAX_MODELS, empty
when the request named none), status_class and target (the process name):
never a request id.
"""

from __future__ import annotations

import errno
from typing import cast
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inferprobe.analyzers.engine_metrics import OCCUPANCY, QUEUE, RUNNING, gauge_values
from inferprobe.analyzers.request_analysis import NONE, RequestAnalysis
from inferprobe.analyzers.scheduler import stall_between
from inferprobe.collector.errors import InferprobeError
from inferprobe.collector.ingest.server_view import ServerViewBuilder
from inferprobe.collector.model.events import (
    EngineIpcKind,
    EngineIpcRecord,
    LlamaStepPhase,
    LlamaStepRecord,
    UsdtProbe,
    UsdtRecord,
)
from inferprobe.collector.model.timeline import DecodeStep, Outcome, Request
from inferprobe.collector.shared_constants import MUTEX_WAIT_THRESHOLD
from inferprobe.exporters.spans import output_tokens, phases

# GenAI semantic conventions, metrics gen_ai.server.time_to_first_token,
# gen_ai.server.time_per_output_token and gen_ai.server.request.duration.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
# Inter-token gaps are usually shorter than time per output token's buckets resolve.
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
# The design card's mutex-wait alert threshold is a bucket edge, so the
# share of requests above it is exact.
RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.3, MUTEX_WAIT_THRESHOLD, 0.5, 0.75, 0.9, 1.0)
# How long the live USDT step view keeps ended steps and requests (a stall spans two steps).
LIVE_STEPS_NS = 60 * 10**9
STALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)

MAX_ENDPOINTS = 64
# The request body's "model" (vLLM and others serve several models and LoRA
# adapters behind one port); any client can send any name, so it is capped
# like endpoints. "" where the request named none.
MAX_MODELS = 32
LABELS = ("endpoint", "model", "status_class", "target")
# The targets' outbound calls (client role), by the server they called (server_address,
# capped like the endpoints): each attempt is one observation, the live path seeing
# attempts end one by one (a retried call's are grouped in the report: analyzers/client_calls.py).
CLIENT_LABELS = ("server_address", "endpoint", "model", "status_class", "target")
MAX_PEERS = 64
# Where containers are traced (record --all, or a target in one): each request's
# container id (collector/processes/containers.py; "" for a process in none), capped too.
CONTAINER_LABEL = "container_id"
MAX_CONTAINERS = 256
# The target label: process names, over days of processes coming and going; capped too.
MAX_TARGETS = 64


class PortBusy(InferprobeError):
    exit_code = 2


def status_class(req: Request) -> str:
    if req.status is not None:
        return f"{req.status // 100}xx"
    return "aborted" if req.outcome == Outcome.ABORTED else "none"


def capped(value: str, seen: set[str], limit: int) -> str:
    """A label value, or "other" once `limit` distinct ones were seen: bounded cardinality."""
    if value in seen:
        return value
    if len(seen) >= limit:
        return "other"
    seen.add(value)
    return value


class Metrics:
    """Owns one registry; observe_*() are called from the recording thread."""

    def __init__(self, targets: dict[int, str], container_label: bool = False):
        self.registry = CollectorRegistry(auto_describe=True)
        self._targets = targets  # pid -> process name; replaced whole by set_targets (the live targets)
        # label values seen, each bounded: MAX_ENDPOINTS, MAX_MODELS, MAX_CONTAINERS, MAX_TARGETS
        # (so is every metric's set of label children: a product of capped values)
        self._endpoints: set[str] = set()
        self._models: set[str] = set()
        self._containers: set[str] = set()
        self._target_names: set[str] = set()
        self._container_label = container_label
        extra = (CONTAINER_LABEL,) if container_label else ()
        labels, client_labels = (*LABELS, *extra), (*CLIENT_LABELS, *extra)
        r = self.registry
        self.ttft = Histogram("gen_ai_server_time_to_first_token_seconds",
                              "Time from the request read to the first token chunk written.",
                              labels, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("gen_ai_server_time_per_output_token_seconds",
                              "Per request: (last - first token time) / (output tokens - 1).",
                              labels, buckets=TPOT_BUCKETS, registry=r)
        self.duration = Histogram("gen_ai_server_request_duration_seconds",
                                  "Time from the request read to the end of the response.",
                                  labels, buckets=DURATION_BUCKETS, registry=r)
        self.itl = Histogram("inferprobe_inter_token_latency_seconds",
                             "Gap between consecutive token chunk writes.",
                             labels, buckets=ITL_BUCKETS, registry=r)
        self.phase = Histogram("inferprobe_phase_duration_seconds",
                               "Time spent in each request phase.",
                               (*labels, "phase"), buckets=DURATION_BUCKETS, registry=r)
        self.mutex_ratio = Histogram("inferprobe_mutex_wait_ratio",
                                     "Share of a request's time its threads waited on locks.",
                                     labels, buckets=RATIO_BUCKETS, registry=r)
        self.gpu_busy = Histogram("inferprobe_request_gpu_busy_seconds",
                                  "GPU execution time of the work a request's steps launched (CUPTI shim).",
                                  labels, buckets=DURATION_BUCKETS, registry=r)
        self.gpu_idle = Histogram("inferprobe_request_gpu_idle_seconds",
                                  "Gaps in which the GPU waited for a request's next work (CUPTI shim).",
                                  labels, buckets=DURATION_BUCKETS, registry=r)
        self.requests = Counter("inferprobe_requests", "Requests finished.", labels, registry=r)
        self.token_chunks = Counter("inferprobe_token_chunks", "Token chunks (writes with SSE data).",
                                    labels, registry=r)
        self.tokens = Counter("inferprobe_output_tokens",
                              "Output tokens as counted by the server (USDT) or stated by the stream "
                              "(usage fields).",
                              labels, registry=r)
        self.in_flight = Gauge("inferprobe_in_flight_requests", "Requests read but not yet finished.",
                               ("target",), registry=r)
        self.lost_events = Counter("inferprobe_lost_events",
                                   "Kernel events lost because the ring buffer was full.", registry=r)
        self.otlp_dropped = Counter("inferprobe_otlp_dropped_traces",
                                    "Traces not delivered to the OTLP backend.", registry=r)
        # source: where the value came from: "usdt" (the server's probes), "engine_metrics"
        # (the engine's own /metrics, record --engine-metrics), "engine_uprobes" (libllama),
        # "engine_ipc" (vLLM's steps, read between its processes: running requests only)
        self.queue_length = Gauge("scheduler_queue_length", "Requests waiting in the server's scheduler.",
                                  ("target", "source"), registry=r)
        self.occupancy = Gauge("token_occupancy_ratio", "KV-cache token slots in use / capacity.",
                               ("target", "source"), registry=r)
        self.running = Gauge("inferprobe_running_requests", "Requests in the engine's running batch.",
                             ("target", "source"), registry=r)
        self.batch_stall = Histogram("batch_stall_duration_seconds",
                                     "Gap between one decode step's end and the next one's start "
                                     "while requests were running.",
                                     ("target", "source"), buckets=STALL_BUCKETS, registry=r)
        self.client_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Outbound call attempt: from its first request byte written to the end of the response read.",
            client_labels, buckets=DURATION_BUCKETS, registry=r)
        self.client_ttfc = Histogram(
            "gen_ai_client_operation_time_to_first_chunk_seconds",
            "Outbound call attempt: from its first request byte written to the first token chunk read.",
            client_labels, buckets=TTFT_BUCKETS, registry=r)
        self.client_tpoc = Histogram(
            "gen_ai_client_operation_time_per_output_chunk_seconds",
            "Outbound call attempt: the gap between consecutive token chunks read.",
            client_labels, buckets=ITL_BUCKETS, registry=r)
        self._peers: set[str] = set()  # bounded: MAX_PEERS
        self._lost_seen = 0
        self._dropped_seen = 0
        # The USDT steps and their requests, built by the ingest stage's own rules (which step a
        # token belongs to); kept for LIVE_STEPS_NS, so memory stays flat.
        self._usdt_steps = ServerViewBuilder()
        self._usdt_forgotten_ns = 0
        # per pid, each dropped at the process's exit (forget_process)
        self._step_before: dict[int, DecodeStep] = {}  # pid -> the step before its last one
        self._stalled: dict[int, DecodeStep] = {}  # pid -> its last step whose stall was observed
        self._llama_last: dict[int, DecodeStep] = {}  # pid -> its last llama.cpp step
        self._server: WSGIServer | None = None

    # -- labels -----------------------------------------------------------------
    def set_targets(self, targets: dict[int, str]) -> None:
        self._targets = dict(targets)

    def target(self, pid: int) -> str:
        name = self._targets.get(pid) or next(iter(self._targets.values()), "unknown")
        return capped(name, self._target_names, MAX_TARGETS)

    def pids(self) -> set[int]:
        """The processes some per-process state is kept for."""
        return set(self._step_before) | set(self._stalled) | set(self._llama_last) | self._usdt_steps.pids()

    def forget_process(self, pid: int) -> None:
        """pid exited: its step state goes (its label children stay: they are counters)."""
        self._step_before.pop(pid, None)
        self._stalled.pop(pid, None)
        self._llama_last.pop(pid, None)
        self._usdt_steps.forget_process(pid)

    def _endpoint(self, req: Request) -> str:
        return capped(req.endpoint, self._endpoints, MAX_ENDPOINTS)

    def _model(self, req: Request) -> str:
        return capped(req.model, self._models, MAX_MODELS) if req.model else ""

    def _container(self, req: Request) -> tuple[str, ...]:
        """The container_id label's value, when the label is on."""
        if not self._container_label:
            return ()
        p = req.process
        cid = p.container.container_id if p is not None and p.container is not None else None
        return (capped(cid, self._containers, MAX_CONTAINERS) if cid else "",)

    # -- requests ---------------------------------------------------------------
    def request_started(self, pid: int) -> None:
        self.in_flight.labels(self.target(pid)).inc()

    def _peer(self, req: Request) -> str:
        return capped(req.peer or "unknown", self._peers, MAX_PEERS)

    def _client_attempt_finished(self, req: Request) -> None:
        labels = (self._peer(req), self._endpoint(req), self._model(req), status_class(req),
                  self.target(req.pid), *self._container(req))
        end = req.t_end_ns if req.t_end_ns is not None else (req.token_ns[-1] if req.token_ns else None)
        if end is not None:
            self.client_duration.labels(*labels).observe((end - req.t_ingress_ns) / 1e9)
        if req.ttft_ns is not None:
            self.client_ttfc.labels(*labels).observe(req.ttft_ns / 1e9)
        per_chunk = self.client_tpoc.labels(*labels)
        for gap in req.itl_ns:
            per_chunk.observe(gap / 1e9)

    def request_finished(self, req: Request, analysis: RequestAnalysis = NONE) -> None:
        """analysis: the report model's findings on it (replayed recordings); none live."""
        target = self.target(req.pid)
        self.in_flight.labels(target).dec()
        if req.role == "client":
            self._client_attempt_finished(req)
            return
        labels = (self._endpoint(req), self._model(req), status_class(req), target, *self._container(req))
        self.requests.labels(*labels).inc()
        if req.ttft_ns is not None:
            self.ttft.labels(*labels).observe(req.ttft_ns / 1e9)
        if req.e2e_ns is not None:
            self.duration.labels(*labels).observe(req.e2e_ns / 1e9)
        if req.token_ns:
            self.token_chunks.labels(*labels).inc(len(req.token_ns))
            itl = self.itl.labels(*labels)
            for gap in req.itl_ns:
                itl.observe(gap / 1e9)
        tokens = output_tokens(req)
        if tokens is not None:
            self.tokens.labels(*labels).inc(tokens)
        n = tokens if tokens is not None else sum(req.token_events)
        if n > 1 and len(req.token_ns) > 1:
            self.tpot.labels(*labels).observe((req.token_ns[-1] - req.token_ns[0]) / 1e9 / (n - 1))
        for name, start, end, _attrs in phases(req):
            self.phase.labels(*labels, name).observe((end - start) / 1e9)
        if analysis.mutex_wait_ratio is not None:
            self.mutex_ratio.labels(*labels).observe(float(analysis.mutex_wait_ratio))
        if analysis.gpu_busy_ns is not None and analysis.gpu_idle_ns is not None:
            self.gpu_busy.labels(*labels).observe(analysis.gpu_busy_ns / 1e9)
            self.gpu_idle.labels(*labels).observe(analysis.gpu_idle_ns / 1e9)

    # -- kernel and exporter counters ------------------------------------------------
    def set_totals(self, lost_events: int, otlp_dropped: int) -> None:
        """Counters that only grow, given as totals: add what is new."""
        if lost_events > self._lost_seen:
            self.lost_events.inc(lost_events - self._lost_seen)
            self._lost_seen = lost_events
        if otlp_dropped > self._dropped_seen:
            self.otlp_dropped.inc(otlp_dropped - self._dropped_seen)
            self._dropped_seen = otlp_dropped

    # -- USDT -------------------------------------------------------------------
    def observe_usdt(self, ev: UsdtRecord) -> None:
        target = self.target(ev.pid)
        if (queue := ev.queue_depth) is not None:
            self.queue_length.labels(target, "usdt").set(queue[0])
            self.running.labels(target, "usdt").set(queue[1])
        elif (used := ev.kv_used) is not None:
            self.occupancy.labels(target, "usdt").set(used)
        self._observe_usdt_step(ev, target)

    def _observe_usdt_step(self, ev: UsdtRecord, target: str) -> None:
        """batch_stall_duration_seconds by analyzers/scheduler.stall_between, as soon as a
        step's first token shows it shares a request with the step before."""
        builder = self._usdt_steps
        if ev.probe == UsdtProbe.DECODE_STEP_START and (last := builder.last_step(ev.pid)) is not None:
            self._step_before[ev.pid] = last
        builder.feed(ev)
        if ev.probe == UsdtProbe.TOKEN_EMIT:
            step, before = builder.last_step(ev.pid), self._step_before.get(ev.pid)
            if step is not None and before is not None and self._stalled.get(ev.pid) is not step:
                stall = stall_between(before, step)
                if stall is not None:
                    self._stalled[ev.pid] = step
                    self.batch_stall.labels(target, "usdt").observe(stall.duration_ns / 1e9)
        if ev.ts_ns - self._usdt_forgotten_ns > LIVE_STEPS_NS:
            builder.forget_before(ev.ts_ns - LIVE_STEPS_NS)
            self._usdt_forgotten_ns = ev.ts_ns

    # -- llama.cpp's engine steps (llama_decode uprobes) ------------------------------
    def observe_llama(self, ev: LlamaStepRecord) -> None:
        """Running sequences at each step, and the stall between two steps that
        share a sequence (analyzers/scheduler.stall_between, live)."""
        target = self.target(ev.pid)
        if ev.phase == LlamaStepPhase.RETURN:
            if (last := self._llama_last.get(ev.pid)) is not None:
                last.t_end_ns = ev.ts_ns
            return
        seqs = {run.seq_id for run in ev.runs}
        self.running.labels(target, "engine_uprobes").set(len(seqs))
        step = DecodeStep(pid=ev.pid, tid=ev.tid, step_id=0, t_start_ns=ev.ts_ns, t_end_ns=None,
                          batch_size=len(seqs), tokens_in_batch=ev.n_tokens, requests=seqs)
        before = self._llama_last.get(ev.pid)
        if before is not None and (stall := stall_between(before, step)) is not None:
            self.batch_stall.labels(target, "engine_uprobes").observe(stall.duration_ns / 1e9)
        self._llama_last[ev.pid] = step

    # -- an engine's messages between its processes (vLLM: bpf/protocols/zmtp.bpf.h) ---------------
    def observe_engine_ipc(self, ev: EngineIpcRecord) -> None:
        """Running requests at each engine step: the entries of its outputs message, counted
        where the engine wrote it (its read by the API server is the same step)."""
        if ev.kind == EngineIpcKind.STEP and not ev.is_read:
            self.running.labels(self.target(ev.pid), "engine_ipc").set(ev.count)

    # -- the engine's own /metrics ------------------------------------------------
    def observe_engine(self, samples: list) -> None:
        """One scrape of the engine's endpoint (collector/attach/engine_scrape.py), mapped
        onto the card's gauges by analyzers/engine_metrics.py's table."""
        target = next(iter(self._targets.values()), "unknown")
        gauges = {QUEUE: self.queue_length, RUNNING: self.running, OCCUPANCY: self.occupancy}
        for gauge, (_metric, value) in gauge_values(samples).items():
            gauges[gauge].labels(target, "engine_metrics").set(value)

    # -- HTTP endpoint ----------------------------------------------------------
    def serve(self, address: str) -> tuple[str, int]:
        """Starts the /metrics endpoint; a busy or bad address is one sentence."""
        from prometheus_client import start_http_server

        host, port = parse_listen_address(address)
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise PortBusy(f"cannot serve Prometheus metrics on {address}: the port is already in use "
                               "(pick another with --prometheus HOST:PORT)") from None
            raise PortBusy(f"cannot serve Prometheus metrics on {address}: {err.strerror or err}") from None
        self._server = server
        # an AF_INET server's address: the host is a str
        return cast(str, server.server_address[0]), server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def parse_listen_address(address: str) -> tuple[str, int]:
    """'127.0.0.1:9464', '[::1]:9464' or ':9464' (localhost); any other host is the user's choice."""
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = "", address
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise PortBusy(f"--prometheus {address!r} is not HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise PortBusy(f"--prometheus {address!r}: port out of range")
    return host, number
