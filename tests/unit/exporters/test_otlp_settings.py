"""OTLP settings: the standard environment variables, overridden by flags."""

from __future__ import annotations

import pytest

from inferprobe.exporters.otlp import ExportSettingsProblem, resolve_settings


def test_defaults_follow_the_specification():
    http = resolve_settings(env={})
    assert (http.protocol, http.endpoint, http.timeout_s) == ("http/protobuf", "http://localhost:4318/v1/traces",
                                                              10.0)
    assert resolve_settings(protocol="grpc", env={}).endpoint == "http://localhost:4317"


def test_environment_then_signal_specific_then_flags():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-team=llm",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}
    s = resolve_settings(env=env)
    assert (s.protocol, s.endpoint, s.timeout_s) == ("grpc", "http://collector:4318", 2.5)
    assert s.headers == {"authorization": "Bearer abc", "x-team": "llm"}
    s = resolve_settings(env={**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert s.endpoint == "http://collector:4318/v1/traces"  # generic endpoint: path appended
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "https://traces.example:443/custom"
    env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    s = resolve_settings(env=env)
    assert (s.protocol, s.endpoint) == ("http/protobuf", "https://traces.example:443/custom")
    s = resolve_settings(protocol="grpc", endpoint="http://127.0.0.1:4317", headers="x-team=infra",
                         timeout_s=1.0, env=env)
    assert (s.protocol, s.endpoint, s.timeout_s) == ("grpc", "http://127.0.0.1:4317", 1.0)
    assert s.headers == {"authorization": "Bearer abc", "x-team": "infra"}


@pytest.mark.parametrize("kwargs, env, words", [
    ({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "not supported"),
    ({"endpoint": "collector:4317"}, {}, "not an http"),
    ({"headers": "novalue"}, {}, "not key=value"),
    ({}, {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "not milliseconds"),
    ({"certificate": "/nonexistent/ca.pem"}, {}, "does not exist"),
])
def test_bad_settings_are_one_sentence(kwargs, env, words):
    with pytest.raises(ExportSettingsProblem, match=words):
        resolve_settings(env=env, **kwargs)
