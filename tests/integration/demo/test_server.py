"""The demo server against the real model: text, SSE framing, usage, errors, disconnects, batching."""

from __future__ import annotations

import json
import socket
import time

import pytest

from inferprobe.demo.sse_client import ClientResult, connect, request_once, run_load

from tests.support.demo import MAX_TOKENS_LIMIT, DemoServer

HOST = "127.0.0.1"
PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The three most important things about learning to cook are",
    "Here is a short poem about the moon:\n",
    "A good way to explain how a bicycle stays upright to a child is",
]


def post(server: DemoServer, path: str, body: dict, req_id: str = "", abort_after: int | None = None
         ) -> ClientResult:
    sock = connect(HOST, server.port, timeout=120)
    try:
        return request_once(sock, HOST, path, body, req_id, abort_after, timeout=120)
    finally:
        sock.close()


def completion(prompt: str, max_tokens: int = 12, **extra) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, **extra}


def chat(content: str, max_tokens: int = 12, **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


def split_stream(res: ClientResult) -> tuple[list[dict], dict, dict | None]:
    """(token chunks, the finish chunk, the usage chunk) of an OpenAI stream."""
    events = [json.loads(e) for e in res.events]
    usage = events.pop() if events and not events[-1]["choices"] else None
    finish = events.pop()
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    return events, finish, usage


def wait_idle(server: DemoServer, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = server.get("/health")
        if health["running"] == 0 and health["waiting"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.1)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streaming(demo_server, path):
    chat_path = "chat" in path
    body = (chat if chat_path else completion)(
        "Name a color." if chat_path else PROMPTS[0], 12, stream=True, stream_options={"include_usage": True})
    res = post(demo_server, path, body, req_id="4242")
    assert res.status == 200 and res.error is None, res
    assert res.headers["content-type"].startswith("text/event-stream")
    assert res.headers["transfer-encoding"] == "chunked"
    assert res.t_done_ns is not None  # data: [DONE] arrived, last
    assert res.body.endswith(b"data: [DONE]\n\n")
    tokens, finish, usage = split_stream(res)
    assert 1 <= len(tokens) <= 12
    assert {e["id"] for e in tokens} == {f"{'chatcmpl' if chat_path else 'cmpl'}-4242"}
    if chat_path:
        assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in tokens)
    else:
        text = "".join(e["choices"][0]["text"] for e in tokens)
    assert len(text.strip()) >= 3 and any(c.isalpha() for c in text)
    assert usage["usage"]["completion_tokens"] == len(tokens)
    assert usage["usage"]["prompt_tokens"] > 0
    if finish["choices"][0]["finish_reason"] == "length":
        assert len(tokens) == 12


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_non_streaming_matches_streaming(demo_server, path):
    chat_path = "chat" in path
    make = chat if chat_path else completion
    prompt = "Write a haiku about rain." if chat_path else PROMPTS[1]
    res = post(demo_server, path, make(prompt, 10))
    assert res.status == 200 and res.headers["content-type"].startswith("application/json")
    doc = json.loads(res.body)
    choice = doc["choices"][0]
    text = choice["message"]["content"] if chat_path else choice["text"]
    assert doc["object"] == ("chat.completion" if chat_path else "text_completion")
    assert any(c.isalpha() for c in text)
    usage = doc["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 10
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 10

    # Greedy decoding: the same request streamed gives the same text, token by token.
    streamed = post(demo_server, path, make(prompt, 10, stream=True))
    tokens, finish, _ = split_stream(streamed)
    key = (lambda e: e["choices"][0]["delta"].get("content", "")) if chat_path else (
        lambda e: e["choices"][0]["text"])
    assert "".join(key(e) for e in tokens) + key(finish) == text
    assert len(tokens) == usage["completion_tokens"]
    assert finish["choices"][0]["finish_reason"] == choice["finish_reason"]


def raw_post(server: DemoServer, path: str, payload: bytes) -> tuple[int, dict]:
    with connect(HOST, server.port, timeout=30) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(payload), payload))
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                data.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0]):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split(b" ")[1]), json.loads(body)


BAD = [
    ("/v1/completions", b"{not json", "invalid_json"),
    ("/v1/completions", b"[1, 2]", None),
    ("/v1/completions", json.dumps({"max_tokens": 4}).encode(), "missing_field"),
    ("/v1/chat/completions", json.dumps({"max_tokens": 4}).encode(), "missing_field"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), None),
    ("/v1/completions", json.dumps(completion("hi", MAX_TOKENS_LIMIT + 1)).encode(), None),
    ("/v1/completions", json.dumps(completion("hi", 0)).encode(), None),
    ("/v1/completions", json.dumps(completion("hi", "8")).encode(), None),
    ("/v1/completions", json.dumps(completion("", 4)).encode(), None),
    # Token ids skip tokenizing 8k words; 8200 + 4 is over SmolLM2's 8192-token context.
    ("/v1/completions", json.dumps({"prompt": [42] * 8200, "max_tokens": 4}).encode(),
     "context_length_exceeded"),
]


@pytest.mark.parametrize(("path", "payload", "code"), BAD,
                         ids=["invalid-json", "not-object", "no-prompt", "no-messages", "bad-role",
                              "max-tokens-over-limit", "max-tokens-zero", "max-tokens-string",
                              "empty-prompt", "over-context"])
def test_bad_input_gets_400(demo_server, path, payload, code):
    before = demo_server.get("/stats")["requests"]["rejected"]
    status, body = raw_post(demo_server, path, payload)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    if code:
        assert body["error"]["code"] == code
    assert demo_server.get("/health")["status"] == "ok"
    assert demo_server.get("/stats")["requests"]["rejected"] == before + 1


def test_disconnect_mid_stream_frees_the_request(demo_server):
    before = demo_server.get("/stats")
    res = post(demo_server, "/v1/completions", completion(PROMPTS[2], MAX_TOKENS_LIMIT, stream=True),
               abort_after=2)
    assert res.aborted and len(res.t_event_ns) == 2
    health = wait_idle(demo_server)
    assert (health["running"], health["waiting"], health["kv_used_tokens"]) == (0, 0, 0)
    after = demo_server.get("/stats")
    assert after["requests"]["aborted"] == before["requests"]["aborted"] + 1
    assert after["finished"].get("abort", 0) == before["finished"].get("abort", 0) + 1
    # Dropped early: far fewer than max_tokens were generated for it.
    assert after["tokens_generated"] - before["tokens_generated"] < MAX_TOKENS_LIMIT
    # and the server still answers
    assert post(demo_server, "/v1/completions", completion(PROMPTS[0], 4)).status == 200


def test_disconnect_while_queued(demo_server):
    """A client that leaves before its request produced anything: also dropped, nothing leaks."""
    s = connect(HOST, demo_server.port)
    payload = json.dumps(completion(PROMPTS[3], MAX_TOKENS_LIMIT, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
              % (len(payload), payload))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()  # RST at once
    health = wait_idle(demo_server)
    assert (health["running"], health["waiting"], health["kv_used_tokens"]) == (0, 0, 0)


def test_continuous_batching_batches(demo_server):
    alone = {p: json.loads(post(demo_server, "/v1/completions", completion(p, 8)).body)["choices"][0]["text"]
             for p in PROMPTS}
    before = demo_server.get("/stats")["decode_batch_sizes"]
    results = run_load(HOST, demo_server.port, connections=4, requests_per_connection=1,
                       body_factory=lambda c, i: completion(PROMPTS[c], 8, stream=True), timeout=120)
    after = demo_server.get("/stats")["decode_batch_sizes"]
    batched = {int(k): v - before.get(k, 0) for k, v in after.items() if int(k) > 1}
    assert any(v > 0 for v in batched.values()), (before, after)
    # Padding the shorter prompts in a batch must not change what greedy decoding produces.
    for c, res in enumerate(results):
        assert res.status == 200 and res.error is None
        tokens, finish, _ = split_stream(res)
        text = "".join(e["choices"][0]["text"] for e in tokens) + finish["choices"][0]["text"]
        assert text == alone[PROMPTS[c]]


def test_client_request_id_and_counter(demo_server):
    res = post(demo_server, "/v1/completions", completion(PROMPTS[0], 2), req_id="123456789")
    assert json.loads(res.body)["id"] == "cmpl-123456789"
    assert res.headers["x-request-id"] == "123456789"
    res = post(demo_server, "/v1/completions", completion(PROMPTS[0], 2), req_id="not-a-number")
    assert json.loads(res.body)["id"].split("-")[1].isdigit()


def test_models_and_health(demo_server):
    models = demo_server.get("/v1/models")
    assert models["data"][0]["id"].startswith("SmolLM2-135M")
    health = demo_server.get("/health")
    assert health["status"] == "ok" and health["kv_capacity_tokens"] > 0
