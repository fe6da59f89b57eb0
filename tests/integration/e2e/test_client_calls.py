"""End to end, client side: an application's outbound LLM API calls, recorded from its own process.

The application is traced, not the server: `record -p APP` on a process
with no listening socket (no flag needed). Clients: the official openai SDK
over HTTP, the anthropic SDK over HTTPS (Python's ssl over libssl), Google's
Gen AI SDKs for Python (google-genai) and Node (@google/genai, Node's own
OpenSSL) against Gemini's streamGenerateContent over HTTPS, Go's net/http
client over HTTP and HTTPS (crypto/tls), and Rust's ureq over HTTPS (rustls
compiled into the program, read at its Reader and Writer); the server is
tests/servers/stream_shapes_fastapi.py, untraced. Each client measures its
own calls with CLOCK_MONOTONIC: when each call began and returned, and when
each token event reached the application.

Tolerances: every token event is received after the read that carried it
returned, the median gap under 1 ms and the 90th percentile under 5 ms (the
SDKs parse each event before handing it over; their first call also warms up
their models); each logical call's span within 20 ms of what the
application measured. Counts are exact. With a server that holds each
call's first attempt past the SDK's timeout, every call is one call of two
attempts: the first closed by the client while waiting for its first byte,
the second grouped with it by the SDK's own x-stainless-retry-count header.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from inferprobe.collector.model.events import path_ends, request_path

from tests.support.go import build_go_program
from tests.support.kernel import needs_root
from tests.support.node import node_binary, node_package
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import inferprobe_cmd, record_client_run, stop_process
from tests.support.rust import rustls_program
from tests.support.tls import self_signed_certificate

pytestmark = [needs_root, pytest.mark.bpf]

MARKER = "PRIVATE-MARKER-5e1d"
SECRET = "sk-SECRET-b7c2e9"
AWS_KEY_ID = "AKIDEXAMPLE"  # the AWS SDKs' access key id (tests/programs/llm_sdk_client.py)
CALLS, TOKENS = 4, 6
SPAN_TOLERANCE_NS = 20_000_000




# The Node clients: the npm package each needs and its program.
NODE_CLIENTS = {"openai-node": ("openai", "openai_node_client.mjs"),
                "gemini-node": ("@google/genai", "gemini_node_client.mjs"),
                "bedrock-node": ("@aws-sdk/client-bedrock-runtime", "bedrock_node_client.mjs")}


def server_command(sdk: str, log: Path) -> list[str]:
    """The server a client calls: FastAPI/uvicorn (HTTP/1.1) for all but the AWS SDK for
    JavaScript, whose default handler speaks HTTP/2 only (Node's http2 module serves it)."""
    if sdk == "bedrock-node":
        return [node_binary(), str(SERVERS / "bedrock_h2_server.js"), str(log)]
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the test extra installs it)")
    return [sys.executable, str(SERVERS / "stream_shapes_fastapi.py"), str(log)]


def client_command(sdk: str, tmp_path: Path, base_url: str, calls: int,
                   extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The client's command line and environment."""
    if sdk == "go":
        exe = build_go_program(PROGRAMS / "llm_go_client.go", tmp_path)
        return [str(exe), base_url, str(calls), str(TOKENS)], dict(os.environ)
    if sdk == "rust":
        return [str(rustls_program("rustls_sse_client")), base_url, str(calls), str(TOKENS)], dict(os.environ)
    if sdk in NODE_CLIENTS:
        package, program = NODE_CLIENTS[sdk]
        env = {**os.environ, "NODE_PATH": node_package(package), "NODE_TLS_REJECT_UNAUTHORIZED": "0"}
        return [node_binary(), str(PROGRAMS / program), base_url, str(calls), str(TOKENS), *extra], env
    module = {"gemini": "google.genai", "bedrock": "botocore", "vertex": "anthropic"}.get(sdk, sdk)
    pytest.importorskip(module, reason=f"the {sdk} SDK is not installed (the test extra installs it)")
    return [sys.executable, str(PROGRAMS / "llm_sdk_client.py"), sdk, base_url, str(calls), str(TOKENS),
            "--wait", "--warm-up", *extra], dict(os.environ)


# The cloud endpoint each Python SDK's base URL names (resolved to the test's server in
# the client: llm_sdk_client.py --resolve): its Host header is the cloud's, as in production.
CLOUD_HOSTS = {"bedrock": "bedrock-runtime.us-west-2.amazonaws.com",
               "boto3": "bedrock-runtime.us-west-2.amazonaws.com",
               "vertex": "us-east5-aiplatform.googleapis.com", "gemini": "generativelanguage.googleapis.com"}


def record_client(tmp_path: Path, sdk: str, scheme: str, calls: int = CALLS, extra: list[str] = ()) -> dict:
    log = tmp_path / "server.log"
    env = {**os.environ, **(self_signed_certificate(tmp_path) if scheme == "https" else {})}
    server = subprocess.Popen(server_command(sdk, log), stdout=subprocess.PIPE, text=True, env=env)
    recording = tmp_path / "run.ipr"
    try:
        port = int(server.stdout.readline())
        host = CLOUD_HOSTS.get(sdk)
        base_url = f"{scheme}://{host or '127.0.0.1'}:{port}"
        command, client_env = client_command(sdk, tmp_path, base_url, calls,
                                             [*extra, *(["--resolve", host] if host else [])])
        out = record_client_run(command, recording, client_env)
    finally:
        stop_process(server)
    report = json.loads(subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"),
                                       capture_output=True, text=True, check=True).stdout)
    text = subprocess.run(inferprobe_cmd("report", str(recording)), capture_output=True, text=True,
                          check=True).stdout
    return {"report": report, "text": text, "recording": recording, "port": port, "server_log": log,
            "app": [_ns_as_ints(json.loads(line)) for line in out.splitlines() if line.startswith("{")]}


def _ns_as_ints(call: dict) -> dict:
    """Node's client writes its nanosecond times as strings (a BigInt has no JSON form)."""
    return {key: ([int(t) for t in value] if isinstance(value, list) else int(value))
            if key.endswith("_ns") else value for key, value in call.items()}


def kept(path: str) -> str:
    """A path as the kernel keeps it: a long one's two ends (Vertex's paths run to 90 bytes)."""
    return request_path(*path_ends(path.encode()))


def attempts_of(report: dict) -> dict[int, list[dict]]:
    calls: dict[int, list[dict]] = {}
    for r in sorted(report["requests"], key=lambda r: r["t_ingress_ns"]):
        assert r["role"] == "client"
        calls.setdefault(r["call"], []).append(r)
    return calls


def receipt_gaps(rec: dict, received: list[int]) -> list[int]:
    """Each token event's receipt minus the return of the read that carried it."""
    carried = [t for t, n in zip(rec["token_ns"], rec["token_chunk_events"], strict=True) for _ in range(n)]
    assert len(carried) == len(received) == TOKENS
    return [got - read for got, read in zip(received, carried, strict=True)]


def check_span(call: dict, app: dict) -> None:
    assert abs(call["duration_ns"] - (app["returned_ns"] - app["began_ns"])) < SPAN_TOLERANCE_NS, (call, app)


CLIENTS = [("openai", "http"), ("anthropic", "https"), ("gemini", "https"), ("gemini-node", "https"),
           ("bedrock", "https"), ("boto3", "https"), ("bedrock-node", "https"), ("vertex", "https"),
           ("go", "http"), ("go", "https"),
           ("rust", "https")]


@pytest.fixture(scope="module", params=CLIENTS, ids=[f"{sdk}-{scheme}" for sdk, scheme in CLIENTS])
def streamed(request, tmp_path_factory):
    sdk, scheme = request.param
    return {"sdk": sdk, "scheme": scheme,
            **record_client(tmp_path_factory.mktemp(f"client-{sdk}-{scheme}"), sdk, scheme)}


def test_every_call_is_one_attempt_with_reads_timed_like_the_application(streamed):
    report, app = streamed["report"], streamed["app"]
    calls = attempts_of(report)
    assert len(calls) == len(app) == CALLS
    gaps = []
    for (attempt,), mine, call in zip(calls.values(), app, report["client_calls"], strict=True):
        assert attempt["outcome"] == "complete" and attempt["status"] == 200
        assert attempt["path"] == kept(mine["path"]) and attempt["model"] == mine["model"]
        assert attempt["transport"] == ("tls" if streamed["scheme"] == "https" else "socket")
        assert attempt["peer"] == f"127.0.0.1:{streamed['port']}"
        gaps += receipt_gaps(attempt, mine["received_ns"])
        check_span(call, mine)
    assert min(gaps) >= 0, min(gaps)
    assert statistics.median(gaps) < 1_000_000, statistics.median(gaps)
    assert sorted(gaps)[int(0.9 * len(gaps))] < 5_000_000
    assert report["lost_events"] == 0


def test_the_output_count_each_stream_states_is_read(streamed):
    """Each stream states its output count, read as the client received it: OpenAI's
    usage chunk, Anthropic's message_delta, Gemini's usageMetadata (candidatesTokenCount,
    growing with each chunk: the last is the total), Bedrock's converse-stream metadata
    event (outputTokens). Bedrock's invoke-with-response-stream states it inside the
    base64 of Anthropic's message_delta, which the kernel does not decode, and counts
    are not read from HTTP/2 streams (the AWS SDK for JavaScript's; docs/http2.md): no count."""
    stated = None if streamed["sdk"] in ("bedrock", "bedrock-node") else TOKENS
    for (attempt,) in attempts_of(streamed["report"]).values():
        assert (attempt["usage"] or {}).get("output_tokens") == stated


# The API each client's calls speak, by their paths (analyzers/llm_apis.py).
APIS = {"openai": ("chat", None), "go": ("chat", None), "rust": ("chat", None),
        "anthropic": ("chat", "anthropic"),
        "gemini": ("generate_content", "gcp.gemini"), "gemini-node": ("generate_content", "gcp.gemini"),
        "bedrock": ("chat", "aws.bedrock"), "boto3": ("chat", "aws.bedrock"),
        "bedrock-node": ("chat", "aws.bedrock"),
        "vertex": ("chat", "gcp.vertex_ai")}


# The region each call's host names (HTTP/1's Host header; not read from HTTP/2 yet).
REGIONS = {"bedrock": "us-west-2", "boto3": "us-west-2", "vertex": "us-east5"}


def test_each_call_names_the_api_its_path_speaks_and_the_region_its_host_names(streamed):
    sdk = streamed["sdk"]
    for call in streamed["report"]["client_calls"]:
        assert (call["operation"], call["provider"]) == APIS[sdk]
        assert call["region"] == REGIONS.get(sdk)
        assert call["host"] == (CLOUD_HOSTS[sdk][:32] if sdk in CLOUD_HOSTS else
                                None if sdk == "bedrock-node" else "127.0.0.1")


def test_connection_reuse_matches_the_server_s_view(streamed):
    """Whether a call reused a pooled connection, against the server's own log of the
    client port of each response (Go's and anthropic's pools reuse one; the openai
    SDK's stream returns its connection to no pool and opens a new one per call). A call
    over the warm-up's connection, still open when the recording began, reused it."""
    attempts = [a for (a,) in attempts_of(streamed["report"]).values()]
    logged = streamed["server_log"].read_text().splitlines()
    warm_up, *ports = [json.loads(line)["peer_port"] for line in logged]
    assert len(ports) == len(attempts)  # the server's first response went to the client's warm-up
    connections = {c["conn_id"]: c for c in streamed["report"]["connections"]}
    seen: set[int] = {warm_up}
    for attempt, port in zip(attempts, ports, strict=True):
        reused = port in seen
        seen.add(port)
        assert attempt["connection_reused"] is reused
        conn = connections[attempt["conn"]]
        assert conn["role"] == "client" and conn["connect_result"] in (0, -115)
        if not reused:
            assert attempt["t_connect_start_ns"] < attempt["t_connect_end_ns"] <= attempt["t_ingress_ns"]
        else:
            assert attempt["t_connect_start_ns"] is None


def test_no_prompt_or_key_leaves_the_kernel_in_the_request_direction(streamed):
    """Nor the AWS SDKs' SigV4 Authorization (its key id) or x-amz-security-token."""
    raw = streamed["recording"].read_bytes()
    for secret in (MARKER, SECRET, "say something", AWS_KEY_ID):
        assert secret.encode() not in raw
        assert secret not in json.dumps(streamed["report"]) and secret not in streamed["text"]


def test_a_timed_out_first_attempt_and_its_retry_are_one_call(tmp_path):
    calls = 2
    got = record_client(tmp_path, "openai", "http", calls,
                        ["--timeout", "1", "--retries", "2", "--stall-first", "1500"])
    report, app = got["report"], got["app"]
    grouped = attempts_of(report)
    assert len(grouped) == len(app) == calls
    for (first, retry), mine, call in zip(grouped.values(), app, report["client_calls"], strict=True):
        assert first["outcome"] == "aborted" and first["t_response_start_ns"] is None
        assert first["retry_count"] == 0 and first["attempt"] == 1
        assert 0.95e9 < first["t_end_ns"] - first["t_ingress_ns"] < 1.2e9  # the SDK's 1 s timeout
        assert retry["outcome"] == "complete" and retry["attempt"] == 2 and retry["retry_count"] == 1
        assert retry["grouped_by"] == "retry header" and retry["conn"] != first["conn"]
        assert len(receipt_gaps(retry, mine["received_ns"])) == TOKENS
        check_span(call, mine)
        assert "waiting for the first byte, closed by the client" in call["explanation"]
        assert "backoff" in call["explanation"] and "attempt 2: connect" in call["explanation"]
    assert any(f["kind"] == "client.retries" for f in report["findings"])
    assert "Outbound calls (client view)" in got["text"]


@pytest.mark.parametrize("sdk, scheme", [("openai", "http"), ("openai-node", "https")])
def test_an_answered_503_and_its_retry_are_one_call(tmp_path, sdk, scheme):
    """The server answers each call's first attempt 503 (its whole JSON error body
    written); the SDK reads the status, closes without reading the body, backs off
    and retries. The 503 is an answered attempt with its status, not an abort, and
    the advice names what happened, not a timeout. Node's SDK (undici over Node's
    own OpenSSL, memory BIOs) writes each request before its TLS session shows
    which socket it runs over: the session is tied at its first read, so every
    attempt has its peer, and no connection is left "unrecognised"."""
    calls = 3
    got = record_client(tmp_path, sdk, scheme, calls, ["--fail-first", "503"])
    report, app = got["report"], got["app"]
    grouped = attempts_of(report)
    assert len(grouped) == len(app) == calls
    for (first, retry), mine, call in zip(grouped.values(), app, report["client_calls"], strict=True):
        assert first["outcome"] == "complete" and first["status"] == 503 and first["attempt"] == 1
        assert first["token_ns"] == []
        assert retry["outcome"] == "complete" and retry["status"] == 200 and retry["retry_count"] == 1
        assert retry["grouped_by"] == "retry header"
        for attempt in (first, retry):
            assert attempt["peer"] == f"127.0.0.1:{got['port']}"
            assert attempt["transport"] == ("tls" if scheme == "https" else "socket")
        assert len(receipt_gaps(retry, mine["received_ns"])) == TOKENS
        check_span(call, mine)
        assert "status 503" in call["explanation"] and "timeout" not in call["explanation"]
        assert "backoff" in call["explanation"] and "backoff -" not in call["explanation"]
    (finding,) = [f for f in report["findings"] if f["kind"] == "client.retries"]
    assert f"{calls} answered 503 (overloaded)" in finding["recommendation"]
    assert "timeout" not in finding["recommendation"]
    assert report["unrecognised_connections"] == 0
    assert "unrecognised" not in got["text"]
    raw = got["recording"].read_bytes()
    assert MARKER.encode() not in raw and SECRET.encode() not in raw


@pytest.mark.parametrize("sdk, grouped_by", [("bedrock", "retry header"), ("boto3", "after a failed attempt"),
                                             ("bedrock-node", "after a failed attempt")])
def test_a_throttled_bedrock_call_and_its_retry_are_one_call(tmp_path, sdk, grouped_by):
    """Bedrock throttles each call's first attempt (429, x-amzn-ErrorType ThrottlingException,
    its JSON body written whole); the SDK backs off and retries: AnthropicBedrock with
    x-stainless-retry-count, boto3 (standard retry mode) with its amz-sdk-request attempt
    number, which the kernel does not read, so its retry is grouped by the failed attempt
    before it. The 429 is an answered attempt, said to be throttling; the retry's chunks
    are timed like the application's."""
    calls = 2
    got = record_client(tmp_path, sdk, "https", calls, ["--fail-first", "429"])
    report, app = got["report"], got["app"]
    grouped = attempts_of(report)
    assert len(grouped) == len(app) == calls
    for (first, retry), mine, call in zip(grouped.values(), app, report["client_calls"], strict=True):
        assert first["outcome"] == "complete" and first["status"] == 429 and first["token_ns"] == []
        assert retry["outcome"] == "complete" and retry["status"] == 200 and retry["grouped_by"] == grouped_by
        assert retry["stream_format"] == "aws-eventstream"
        assert len(receipt_gaps(retry, mine["received_ns"])) == TOKENS
        check_span(call, mine)
        assert "status 429 (throttled" in call["explanation"] and "timeout" not in call["explanation"]
        assert call["provider"] == "aws.bedrock"
    (finding,) = [f for f in report["findings"] if f["kind"] == "client.retries"]
    assert f"{calls} answered 429 (throttled" in finding["recommendation"]
    raw = got["recording"].read_bytes()
    assert SECRET.encode() not in raw and AWS_KEY_ID.encode() not in raw


def test_a_new_tls_connection_times_its_handshake(streamed):
    """OpenSSL's handshake (SSL_do_handshake returning 1) between the TCP connect
    and the first request byte; Go's crypto/tls handshake and rustls's are not hooked
    (docs/tls.md), and Node's, driven inside SSL_read on a memory BIO, is not timed apart
    (docs/client-calls.md)."""
    first = next(iter(attempts_of(streamed["report"]).values()))[0]
    if streamed["scheme"] != "https" or streamed["sdk"] in ("go", "rust") or streamed["sdk"] in NODE_CLIENTS:
        assert first["t_tls_done_ns"] is None
        return
    assert first["t_connect_end_ns"] < first["t_tls_done_ns"] <= first["t_ingress_ns"]
    (call,) = [c for c in streamed["report"]["client_calls"] if c["call"] == first["call"]]
    assert "TLS handshake" in call["explanation"]


@pytest.mark.parametrize("sdk, scheme", [("openai", "http"), ("anthropic", "https")])
def test_unary_calls_are_attempts_without_tokens(tmp_path, sdk, scheme):
    got = record_client(tmp_path, sdk, scheme, 3, ["--unary"])
    report, app = got["report"], got["app"]
    calls = attempts_of(report)
    assert len(calls) == len(app) == 3
    for (attempt,), mine, call in zip(calls.values(), app, report["client_calls"], strict=True):
        assert attempt["outcome"] == "complete" and attempt["status"] == 200 and not attempt["streaming"]
        assert attempt["token_ns"] == [] and attempt["t_response_start_ns"] > attempt["t_ingress_ns"]
        assert attempt["path"] == mine["path"]
        check_span(call, mine)
        assert "first byte" in call["explanation"]
