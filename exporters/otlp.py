"""OTLP trace export: settings from the standard environment, and a shipper.

Settings follow the OpenTelemetry exporter specification: the signal
specific OTEL_EXPORTER_OTLP_TRACES_* variable wins over OTEL_EXPORTER_OTLP_*,
and a command-line flag wins over both. OTEL_EXPORTER_OTLP_TIMEOUT is in
milliseconds, as the specification says.

The shipper is our own small bounded queue in front of the SDK's OTLP
exporters (which do the encoding, TLS, compression and retries with
backoff). The SDK's BatchSpanProcessor would drop spans on a full queue or a
failed export without counting them; here every lost trace is counted
(`dropped`), because the report and a metric must show it. A dead or slow
backend only ever costs a failed put_nowait on the recording thread.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from inferprobe.analyzers.client_calls import ClientCall
from inferprobe.analyzers.request_analysis import NONE, RequestAnalysis
from inferprobe.collector.errors import InferprobeError
from inferprobe.collector.model.timeline import Request
from inferprobe.exporters.clock import WallClock
from inferprobe.exporters.spans import (
    DEFAULT_MAX_TOKEN_EVENTS,
    Attributes,
    ServerInfo,
    SpanShape,
    call_trace,
    request_trace,
)

PROTOCOLS = ("grpc", "http/protobuf")
# Per-process OTLP resources kept (days of short-lived processes): least recently used go first.
MAX_RESOURCES = 1024
DEFAULT_ENDPOINTS = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}
HTTP_TRACES_PATH = "/v1/traces"


class ExportSettingsProblem(InferprobeError):
    exit_code = 2


@dataclass(frozen=True)
class OtlpSettings:
    protocol: str
    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    certificate: str | None = None
    insecure: bool | None = None


def _env(env: Mapping[str, str], name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_TRACES_<name>, else OTEL_EXPORTER_OTLP_<name>."""
    for key in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = env.get(key, "").strip()
        if value:
            return value
    return None


def parse_headers(text: str | None, source: str) -> dict[str, str]:
    """'k1=v1,k2=v2' with URL-encoded values (the W3C baggage-like OTel format)."""
    headers: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ExportSettingsProblem(f"{source}: header {item.strip()!r} is not key=value")
        headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers


def _http_traces_url(base: str) -> str:
    """The generic endpoint is a base URL: /v1/traces is appended (OTel spec)."""
    return base.rstrip("/") + HTTP_TRACES_PATH


def resolve_settings(
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: str | None = None,
    timeout_s: float | None = None,
    certificate: str | None = None,
    insecure: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> OtlpSettings:
    env = os.environ if env is None else env
    proto = (protocol or _env(env, "PROTOCOL") or "http/protobuf").lower()
    if proto not in PROTOCOLS:
        raise ExportSettingsProblem(
            f"OTLP protocol {proto!r} is not supported: use one of {', '.join(PROTOCOLS)}")
    if endpoint:
        url = endpoint
        if proto == "http/protobuf" and urlparse(url).path in ("", "/"):
            url = _http_traces_url(url)
    elif env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        url = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].strip()  # signal-specific: used as is
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        base = env["OTEL_EXPORTER_OTLP_ENDPOINT"].strip()
        url = _http_traces_url(base) if proto == "http/protobuf" else base
    else:
        default = DEFAULT_ENDPOINTS[proto]
        url = _http_traces_url(default) if proto == "http/protobuf" else default
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ExportSettingsProblem(f"OTLP endpoint {url!r} is not an http:// or https:// URL with a host")
    merged = parse_headers(_env(env, "HEADERS"), "OTEL_EXPORTER_OTLP_HEADERS")
    merged.update(parse_headers(headers, "--otlp-headers"))
    if timeout_s is None:
        raw = _env(env, "TIMEOUT")
        try:
            timeout_s = float(raw) / 1000 if raw else 10.0
        except ValueError:
            raise ExportSettingsProblem(f"OTEL_EXPORTER_OTLP_TIMEOUT={raw!r} is not milliseconds") from None
    if timeout_s <= 0:
        raise ExportSettingsProblem("the OTLP timeout must be positive")
    if insecure is None:
        raw = _env(env, "INSECURE")
        insecure = None if raw is None else raw.lower() == "true"
    cert = certificate or _env(env, "CERTIFICATE")
    if cert and not os.path.isfile(cert):
        raise ExportSettingsProblem(f"OTLP certificate file {cert} does not exist")
    return OtlpSettings(protocol=proto, endpoint=url, headers=merged, timeout_s=timeout_s,
                        certificate=cert, insecure=insecure)


def quiet_sdk_logging() -> None:
    """The SDK logs each failed batch ("Failed to export span batch", "Exporter
    already shutdown, ignoring batch") through Python's last-resort handler,
    beside inferprobe's own one sentence and its drop counts, which already
    say what was lost: keep them out of the user's terminal."""
    import logging

    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(h, logging.NullHandler) for h in sdk.handlers):
        sdk.addHandler(logging.NullHandler())
    sdk.propagate = False


def make_exporter(settings: OtlpSettings):
    """The SDK's OTLP span exporter for the chosen protocol."""
    quiet_sdk_logging()
    if settings.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        parsed = urlparse(settings.endpoint)
        credentials = None
        if settings.certificate:
            with open(settings.certificate, "rb") as f:
                credentials = grpc.ssl_channel_credentials(f.read())
        insecure = settings.insecure
        if insecure is None:
            insecure = parsed.scheme == "http"
        return GrpcSpanExporter(endpoint=settings.endpoint, insecure=insecure, credentials=credentials,
                                headers=settings.headers or None, timeout=settings.timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    return HttpSpanExporter(endpoint=settings.endpoint, headers=settings.headers or None,
                            timeout=settings.timeout_s, certificate_file=settings.certificate)


# ------------------------------------------------------------------ resources


def resource_attributes(service_name: str, pid: int, executable: str | None) -> Attributes:
    attrs: Attributes = {
        "service.name": service_name,
        "host.name": socket.gethostname(),
        "process.pid": pid,
    }
    if executable:
        attrs["process.executable.name"] = executable
    return attrs


# ------------------------------------------------------------------ spans


def to_readable_spans(shape: SpanShape, clock: WallClock, resource, scope, id_generator) -> list:
    """One trace's SDK spans (root first), times on the wall clock."""
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import SpanKind, Status, StatusCode

    flags = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)
    # A request that carried the caller's traceparent joins the caller's trace, its
    # root a child of the caller's span (docs/trace-context.md); else a trace of its own.
    remote, state = None, None
    if shape.parent is not None:
        trace_id = int(shape.parent.trace_id, 16)
        if shape.parent.tracestate:
            state = trace_api.TraceState.from_header([shape.parent.tracestate])
        remote = trace_api.SpanContext(trace_id, int(shape.parent.span_id, 16), is_remote=True,
                                       trace_flags=trace_api.TraceFlags(shape.parent.trace_flags),
                                       trace_state=state)
    else:
        trace_id = id_generator.generate_trace_id()

    def build(s: SpanShape, parent) -> list:
        ctx = trace_api.SpanContext(trace_id, id_generator.generate_span_id(), is_remote=False,
                                    trace_flags=flags, trace_state=state)
        span = ReadableSpan(
            name=s.name,
            context=ctx,
            parent=parent,
            resource=resource,
            attributes=s.attributes,
            events=[Event(e.name, e.attributes, clock.to_wall_ns(e.time_ns)) for e in s.events],
            kind={"server": SpanKind.SERVER, "client": SpanKind.CLIENT}.get(s.kind, SpanKind.INTERNAL),
            status=Status(StatusCode.ERROR) if s.error else Status(StatusCode.UNSET),
            start_time=clock.to_wall_ns(s.start_ns),
            end_time=clock.to_wall_ns(s.end_ns),
            instrumentation_scope=scope,
        )
        out = [span]
        for child in s.children:
            out.extend(build(child, ctx))
        return out

    return build(shape, remote)


@dataclass
class ShipperStats:
    submitted: int = 0  # traces handed to the shipper
    exported: int = 0  # traces the backend accepted
    dropped: int = 0  # traces lost: queue full, export failed, or still queued at close
    dropped_queue_full: int = 0
    failed_batches: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class SpanShipper:
    """Bounded queue of finished requests -> batches of spans -> an OTLP exporter.

    submit() never blocks. A worker thread turns requests into spans and
    exports them in batches of up to `batch_traces` (or whatever arrived
    within `batch_delay_s`); the exporter retries transient failures with
    backoff until its timeout, after which that batch counts as dropped.
    """

    def __init__(
        self,
        exporter,
        clock: WallClock,
        resource_for_pid: Callable[[int], Attributes],
        server: ServerInfo | None = None,
        max_token_events: int = DEFAULT_MAX_TOKEN_EVENTS,
        queue_traces: int = 4096,
        batch_traces: int = 256,
        batch_delay_s: float = 0.5,
    ):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self._exporter = exporter
        self._clock = clock
        self._server = server or ServerInfo()
        self._max_token_events = max_token_events
        self._resource_for_pid = resource_for_pid
        # pid -> its resource, the worker thread's; bounded: MAX_RESOURCES, least recently used first out
        self._resources: OrderedDict[int, Resource] = OrderedDict()
        self._resource_cls = Resource
        self._scope = InstrumentationScope("inferprobe", _version())
        self._ids = RandomIdGenerator()
        # A finished request, or (replay) a logical outbound call with one analysis per attempt.
        self._queue: queue.Queue[tuple[Request | ClientCall, Any]] = queue.Queue(maxsize=queue_traces)
        self._batch_traces = batch_traces
        self._batch_delay_s = batch_delay_s
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.stats = ShipperStats()
        self._worker = threading.Thread(target=self._run, name="inferprobe-otlp", daemon=True)
        self._worker.start()

    # -- recording thread -------------------------------------------------------
    def submit(self, req: Request, block: bool = False, analysis: RequestAnalysis = NONE) -> bool:
        """Queues one finished request; block=True (replay) waits for room instead of dropping.
        analysis: the report model's findings on it (replay); none live."""
        with self._lock:
            self.stats.submitted += 1
        try:
            self._queue.put((req, analysis), block=block)
            return True
        except queue.Full:
            with self._lock:
                self.stats.dropped += 1
                self.stats.dropped_queue_full += 1
            return False

    def submit_call(self, call: ClientCall, analyses: Sequence[RequestAnalysis]) -> None:
        """Queues one logical outbound call as one trace (replay: waits for room)."""
        with self._lock:
            self.stats.submitted += 1
        self._queue.put((call, tuple(analyses)), block=True)

    def close(self, timeout_s: float = 5.0) -> ShipperStats:
        """Exports what is queued for up to timeout_s, then counts the rest as dropped."""
        self._closing.set()
        self._worker.join(timeout_s)
        # shutdown() aborts an export stuck in retries; the worker then finishes
        self._exporter.shutdown()
        self._worker.join(2.0)
        leftover = 0
        while True:
            try:
                self._queue.get_nowait()
                leftover += 1
            except queue.Empty:
                break
        with self._lock:
            self.stats.dropped += leftover
        return self.stats

    # -- worker -----------------------------------------------------------------
    def _resource(self, pid: int):
        res = self._resources.get(pid)
        if res is None:
            res = self._resources[pid] = self._resource_cls.create(self._resource_for_pid(pid))
            if len(self._resources) > MAX_RESOURCES:  # made again if asked for: nothing is lost
                self._resources.popitem(last=False)
        else:
            self._resources.move_to_end(pid)
        return res

    def _next_batch(self) -> list[tuple[Request | ClientCall, Any]]:
        batch: list[tuple[Request | ClientCall, Any]] = []
        try:
            batch.append(self._queue.get(timeout=0.1))
        except queue.Empty:
            return batch
        deadline = time.monotonic() + (0 if self._closing.is_set() else self._batch_delay_s)
        while len(batch) < self._batch_traces:
            remaining = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                batch.append(item)
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while True:
            batch = self._next_batch()
            if not batch:
                if self._closing.is_set():
                    return
                continue
            spans = []
            for item, analysis in batch:
                if isinstance(item, ClientCall):
                    shape = call_trace(item, analysis, self._max_token_events)
                    pid = item.attempts[0].request.pid
                else:
                    shape = request_trace(item, self._server, self._max_token_events, analysis=analysis)
                    pid = item.pid
                spans.extend(to_readable_spans(shape, self._clock, self._resource(pid), self._scope,
                                               self._ids))
            try:
                ok = self._exporter.export(spans) == SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - an exporter bug must not kill the worker
                ok = False
            with self._lock:
                if ok:
                    self.stats.exported += len(batch)
                else:
                    self.stats.dropped += len(batch)
                    self.stats.failed_batches += 1


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inferprobe")
    except PackageNotFoundError:
        return "0+unknown"
