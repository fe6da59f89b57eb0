"""OTLP and Prometheus flags, shared by `record` (live) and `export` (replay).

Every OTLP flag overrides the matching standard OTEL_EXPORTER_OTLP_* (or
OTEL_EXPORTER_OTLP_TRACES_*) environment variable; unset flags leave the
environment in charge.
"""

from __future__ import annotations

import click

from inferprobe.exporters.spans import DEFAULT_MAX_TOKEN_EVENTS


def otlp_options(f):
    for decorator in reversed([
        click.option("--otlp-endpoint", "--endpoint", "otlp_endpoint", default=None,
                     help="OTLP endpoint URL (env OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; default "
                     "http://localhost:4318/v1/traces, or http://localhost:4317 for grpc)."),
        click.option("--otlp-protocol", "--protocol", "otlp_protocol",
                     type=click.Choice(["grpc", "http/protobuf"]), default=None,
                     help="OTLP transport (env OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL; "
                     "default http/protobuf)."),
        click.option("--otlp-headers", "--headers", "otlp_headers", default=None, metavar="K=V,...",
                     help="Extra request headers, e.g. authorization=Bearer%20x "
                     "(merged over env OTEL_EXPORTER_OTLP_[TRACES_]HEADERS)."),
        click.option("--otlp-timeout", "otlp_timeout", type=click.FloatRange(min=0, min_open=True),
                     default=None, help="Seconds per export, retries included "
                     "(env OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT, in ms; default 10)."),
        click.option("--otlp-certificate", "otlp_certificate", type=click.Path(dir_okay=False),
                     default=None,
                     help="CA certificate for TLS (env OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE)."),
        click.option("--otlp-insecure", "otlp_insecure", is_flag=True, default=None,
                     help="gRPC without TLS even for a non-http:// endpoint (env ..._INSECURE)."),
        click.option("--service-name", default=None,
                     help="OTLP resource service.name (default: the target's process name)."),
        click.option("--max-token-events", type=click.IntRange(min=0), default=DEFAULT_MAX_TOKEN_EVENTS,
                     show_default=True, help="Token chunks shown as span events per request; "
                     "beyond that one summary event gives the count."),
    ]):
        f = decorator(f)
    return f


def live_export_options(f):
    f = click.option("--otlp", is_flag=True,
                     help="Export each request as an OTLP trace while recording.")(otlp_options(f))
    return click.option(
        "--prometheus", "prometheus", default=None, metavar="HOST:PORT",
        help="Serve Prometheus metrics while recording, e.g. 127.0.0.1:9464 (binding a "
        "non-local address is your explicit choice).")(f)
