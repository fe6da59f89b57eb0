"""Builds the exporters from command-line values and a recording's metadata.

The Prometheus and OTLP libraries are imported only when an exporter is
built: `record` imports this module whatever its flags, and the two cost a
recording without them ~10 MB resident (prometheus_client alone 9 MB)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from inferprobe.collector.errors import InferprobeError
from inferprobe.collector.model.recording_meta import RecordingMeta
from inferprobe.collector.processes.containers import ProcessIdentities
from inferprobe.exporters.clock import WallClock
from inferprobe.exporters.spans import Attributes, server_info

if TYPE_CHECKING:
    from inferprobe.exporters.metrics import Metrics
    from inferprobe.exporters.otlp import SpanShipper


class ExportProblem(InferprobeError):
    """Traces could not be delivered."""

    exit_code = 6


def make_shipper(meta: Mapping[str, Any], clock: WallClock, opts: dict,
                 live: bool) -> tuple[SpanShipper, str]:
    """A shipper for the OTLP flags in opts; returns it and the endpoint it sends to."""
    from inferprobe.exporters.otlp import SpanShipper, make_exporter, resolve_settings, resource_attributes

    settings = resolve_settings(
        protocol=opts.get("otlp_protocol"),
        endpoint=opts.get("otlp_endpoint"),
        headers=opts.get("otlp_headers"),
        timeout_s=opts.get("otlp_timeout"),
        certificate=opts.get("otlp_certificate"),
        insecure=opts.get("otlp_insecure"),
    )
    names = RecordingMeta.of(meta).target_names
    default_name = next(iter(names.values()), "unknown")
    service = opts.get("service_name") or default_name

    def resource_for_pid(pid: int) -> Attributes:
        exe = names.get(pid)
        if exe is None and live:
            from inferprobe.collector.processes.targets import process_name

            exe = process_name(pid) or default_name
        return resource_attributes(service, pid, exe or default_name)

    shipper = SpanShipper(
        make_exporter(settings), clock, resource_for_pid, server=server_info(meta),
        max_token_events=opts.get("max_token_events", 256),
    )
    return shipper, f"{settings.endpoint} ({settings.protocol})"


def make_metrics(meta: Mapping[str, Any]) -> Metrics:
    from inferprobe.exporters.metrics import Metrics

    return Metrics(RecordingMeta.of(meta).target_names)


def bind_prometheus(address: str | None, container_label: bool = False) -> Metrics | None:
    """Serves /metrics at once, so a busy port fails before any BPF is compiled.
    container_label: the request metrics get a container_id label (exporters/metrics.py)."""
    if not address:
        return None
    from inferprobe.exporters.metrics import Metrics

    metrics = Metrics({}, container_label=container_label)
    metrics.serve(address)
    return metrics


def start_live_export(meta: Mapping[str, Any], metrics: Metrics | None, otlp: bool, opts: dict,
                      identities: ProcessIdentities | None = None):
    """The LiveExport for `record`, or None when neither --otlp nor --prometheus was given.
    identities: where each process runs (the recorder's, shared so each is read once)."""
    if metrics is None and not otlp:
        return None
    from inferprobe.exporters.live import LiveExport

    clock = WallClock.from_recording(meta, [])
    if metrics is not None:
        metrics.set_targets(RecordingMeta.of(meta).target_names)
    shipper = make_shipper(meta, clock, opts, live=True)[0] if otlp else None
    return LiveExport(clock, shipper=shipper, metrics=metrics, identities=identities)
