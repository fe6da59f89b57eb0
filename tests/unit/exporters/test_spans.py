"""Trace shapes built from Request timelines (pure, no OpenTelemetry)."""

from __future__ import annotations

from inferprobe.analyzers.decompose import phases_ns
from inferprobe.analyzers.request_analysis import RequestAnalysis
from inferprobe.collector.model.timeline import Outcome, Request, ServerRequest
from inferprobe.exporters.spans import (
    TOKEN_EVENT,
    TOKEN_SUMMARY_EVENT,
    ServerInfo,
    genai_attributes,
    operation_name,
    request_trace,
    server_info,
)

MS = 1_000_000


def _streamed(tokens: int, path: str = "/v1/chat/completions") -> Request:
    t0 = 10_000 * MS
    return Request(pid=7, tid=8, conn=3, method="POST", path=path, t_ingress_ns=t0, status=200,
                   outcome=Outcome.COMPLETE, t_response_start_ns=t0 + 5 * MS,
                   token_ns=[t0 + (20 + 2 * i) * MS for i in range(tokens)], token_events=[1] * tokens,
                   t_end_ns=t0 + (21 + 2 * tokens) * MS, streaming=True, end_reason="framing")


def _assert_contiguous(root) -> None:
    assert root.children[0].start_ns == root.start_ns
    assert root.children[-1].end_ns == root.end_ns
    for a, b in zip(root.children, root.children[1:], strict=False):
        assert a.end_ns == b.start_ns


def test_streamed_request_root_phases_and_genai_attributes():
    req = _streamed(5)
    root = request_trace(req, ServerInfo("127.0.0.1", 8000))
    assert root.kind == "server" and root.name == "chat"
    assert (root.start_ns, root.end_ns) == (req.t_ingress_ns, req.t_end_ns)
    assert [c.name for c in root.children] == ["response_headers", "first_token", "decode", "finish"]
    _assert_contiguous(root)
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.time_to_first_chunk"] == req.ttft_ns / 1e9
    assert "gen_ai.usage.output_tokens" not in a  # chunks are not tokens: never guessed
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", 8000)
    assert (a["http.request.method"], a["url.path"], a["http.response.status_code"]) == (
        "POST", "/v1/chat/completions", 200)
    assert "error.type" not in a and not root.error
    assert [e.time_ns for e in root.events] == req.token_ns


def test_token_events_are_bounded_with_a_summary():
    req = _streamed(40)
    root = request_trace(req, max_token_events=16)
    shown = [e for e in root.events if e.name == TOKEN_EVENT]
    summary = [e for e in root.events if e.name == TOKEN_SUMMARY_EVENT]
    assert len(shown) == 16 and len(summary) == 1
    assert summary[0].attributes == {"inferprobe.token_chunks.total": 40,
                                     "inferprobe.token_chunks.not_shown": 24}
    assert len(request_trace(req, max_token_events=0).events) == 1


def test_server_phases_and_usdt_fields_win_when_present():
    req = _streamed(3)
    t0 = req.t_ingress_ns
    req.server = ServerRequest(pid=7, req_id=42, t_start_ns=t0 + MS, t_queued_ns=t0 + MS,
                               t_scheduled_ns=t0 + 3 * MS, t_prefill_start_ns=t0 + 4 * MS,
                               t_prefill_end_ns=t0 + 15 * MS, token_ns=[t0 + 19 * MS],
                               t_end_ns=req.t_end_ns, output_tokens=9, status=0)
    req.correlated_by = "conn_fd"
    root = request_trace(req)
    assert [c.name for c in root.children] == ["ingress", "queue", "schedule", "prefill", "first_token",
                                               "network_flush", "decode", "finish"]
    assert [c.end_ns - c.start_ns for c in root.children] == list(phases_ns(req).values())
    assert root.children[3].end_ns - root.children[3].start_ns == 11 * MS  # prefill
    _assert_contiguous(root)
    assert root.attributes["inferprobe.usdt_request_id"] == 42
    assert root.attributes["gen_ai.usage.output_tokens"] == 9


def test_errors_and_aborts_set_error_type():
    req = _streamed(2)
    req.status = 503
    assert request_trace(req).attributes["error.type"] == "503"
    aborted = _streamed(2)
    aborted.outcome = Outcome.ABORTED
    root = request_trace(aborted)
    assert root.error and root.attributes["error.type"] == "aborted"


def test_plain_http_request_is_named_by_route_and_has_no_genai_attributes():
    t0 = 5 * MS
    req = Request(pid=1, tid=1, conn=1, method="GET", path="/health", t_ingress_ns=t0, status=200,
                  outcome=Outcome.COMPLETE, t_response_start_ns=t0 + MS, t_end_ns=t0 + 2 * MS)
    root = request_trace(req)
    assert root.name == "GET /health"
    assert not any(k.startswith("gen_ai.") for k in root.attributes)
    assert [c.name for c in root.children] == ["response_headers", "finish"]
    _assert_contiguous(root)


def test_operation_names_and_server_info():
    assert operation_name("/v1/completions") == "text_completion"
    assert operation_name("/v1/embeddings") == "embeddings"
    assert operation_name("/metrics") is None
    assert genai_attributes("/v1/messages") == {"gen_ai.operation.name": "chat",
                                                "gen_ai.provider.name": "anthropic"}
    # OpenAI's path is every compatible server's: no provider
    assert genai_attributes("/v1/chat/completions") == {"gen_ai.operation.name": "chat"}
    assert genai_attributes("/metrics") == {}
    # the host a client named: the provider an OpenAI path leaves open, a cloud's region
    assert genai_attributes("/v1/chat/completions", "api.openai.com") == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai"}
    assert genai_attributes("/model/m/converse-stream", "bedrock-runtime.us-west-2.amazon") == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "aws.bedrock", "cloud.region": "us-west-2"}
    assert server_info({"listening": ["tcp 127.0.0.1:8000"]}) == ServerInfo("127.0.0.1", 8000)
    assert server_info({"listening": ["tcp 0.0.0.0:8000", "tcp6 :::8000"]}) == ServerInfo(None, 8000)
    assert server_info({"listening": ["tcp 0.0.0.0:8000", "tcp 0.0.0.0:9000"]}) == ServerInfo()


def test_lock_and_gpu_waits_become_child_spans_after_the_phases():
    from inferprobe.collector.model.timeline import WaitInterval

    req = _streamed(3)
    t0 = req.t_ingress_ns
    # what the report model's analysis found about the request (analyzers/request_analysis.py)
    analysis = RequestAnalysis(
        lock_waits=(WaitInterval(t0 + 2 * MS, t0 + 3 * MS, "lock", "0x7f00"),
                    WaitInterval(t0 + 4 * MS, t0 + 4 * MS + 10, "gil", "0x7f08")),
        gpu_waits=(WaitInterval(t0 + 21 * MS, t0 + 22 * MS, "gpu", "cudaStreamSynchronize"),))
    root = request_trace(req, analysis=analysis)
    phase_names = [n for n in phases_ns(req)]
    assert [c.name for c in root.children] == [*phase_names, "lock wait", "lock wait", "gpu wait"]
    locks_, gpu = root.children[len(phase_names):-1], root.children[-1]
    assert [(c.start_ns, c.end_ns) for c in locks_] == [(w.start_ns, w.end_ns)
                                                        for w in analysis.lock_waits]
    assert locks_[1].attributes == {"inferprobe.wait.kind": "gil", "inferprobe.futex.address": "0x7f08"}
    assert gpu.attributes == {"inferprobe.wait.kind": "gpu",
                              "inferprobe.cuda.function": "cudaStreamSynchronize"}
    assert all(c.kind == "internal" for c in root.children)
    assert root.attributes["inferprobe.lock_waits"] == 2 and root.attributes["inferprobe.gpu_waits"] == 1
    assert "inferprobe.lock_waits.not_shown" not in root.attributes


def test_wait_spans_keep_the_longest_and_count_the_rest():
    from inferprobe.collector.model.timeline import WaitInterval

    req = _streamed(2)
    t0 = req.t_ingress_ns
    # waits of 1..40 us, one every 100 us
    analysis = RequestAnalysis(lock_waits=tuple(
        WaitInterval(t0 + k * 100_000, t0 + k * 100_000 + k * 1000, "lock", "0x10") for k in range(1, 41)))
    root = request_trace(req, max_wait_spans=32, analysis=analysis)
    waits = [c for c in root.children if c.name == "lock wait"]
    assert len(waits) == 32
    assert sorted(c.end_ns - c.start_ns for c in waits) == [k * 1000 for k in range(9, 41)]
    assert [c.start_ns for c in waits] == sorted(c.start_ns for c in waits)  # time order
    assert root.attributes["inferprobe.lock_waits"] == 40
    assert root.attributes["inferprobe.lock_waits.not_shown"] == 8


def test_no_wait_sources_no_wait_spans_or_counts():
    root = request_trace(_streamed(2))
    assert not [c for c in root.children if c.name.endswith(" wait")]
    assert "inferprobe.lock_waits" not in root.attributes and "inferprobe.gpu_waits" not in root.attributes


def test_model_and_the_counts_a_stream_states_become_genai_attributes():
    req = _streamed(5)
    req.model, req.output_tokens, req.input_tokens = "llama3.2:1b", 9, 26
    a = request_trace(req, ServerInfo("127.0.0.1", 8000)).attributes
    assert (a["gen_ai.request.model"], a["gen_ai.usage.output_tokens"], a["gen_ai.usage.input_tokens"]) == (
        "llama3.2:1b", 9, 26)
    # the server's own count (USDT request_end) wins over the stream's
    req.server = ServerRequest(pid=7, req_id=1, output_tokens=8)
    assert request_trace(req, ServerInfo("127.0.0.1", 8000)).attributes["gen_ai.usage.output_tokens"] == 8


def test_the_mutex_wait_ratio_comes_from_the_model_not_the_request():
    req = _streamed(2)
    assert "mutex.wait.ratio" not in request_trace(req).attributes  # live: no analysis
    root = request_trace(req, analysis=RequestAnalysis(mutex_wait_ratio=0.42))
    assert root.attributes["mutex.wait.ratio"] == 0.42
    # without lock tracing the waits are unknown, not zero: no count on the root
    assert "inferprobe.lock_waits" not in root.attributes
    traced = request_trace(req, analysis=RequestAnalysis(lock_waits=()))
    assert traced.attributes["inferprobe.lock_waits"] == 0
