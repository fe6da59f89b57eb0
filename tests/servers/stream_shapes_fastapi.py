"""The LLM stream shapes on FastAPI/uvicorn (StreamingResponse): the same
endpoints, payloads and log as stream_shapes.js and stream_shapes.go.

Usage: stream_shapes_fastapi.py LOG; prints the port. Another ASGI server
imports `app` from here with the log's path in STREAM_SHAPES_LOG
(stream_shapes_granian.py). Each token write's
CLOCK_MONOTONIC (time.monotonic_ns) is taken as the generator yields it
(token_ns), and again when the generator resumes (token_written_ns): uvicorn
writes each yielded chunk in the send() Starlette awaits before it asks for
the next one.

TLS mode, as for stream_shapes.go: with STREAM_SHAPES_TLS_CERT and
STREAM_SHAPES_TLS_KEY set (PEM files), uvicorn serves HTTPS (its
--ssl-certfile/--ssl-keyfile), through Python's ssl module and OpenSSL.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository: tests.support
from tests.support import aws_event_stream  # noqa: E402 - after the path it needs

SHAPES = json.loads((Path(__file__).with_name("stream_shapes_payloads.json")).read_text())
# Gemini's streamGenerateContent?alt=sse, served here only (the shared payloads are
# every stack's): the model is in the path, usageMetadata in every chunk, the
# candidates' count growing with each.
GEMINI_PATH = re.compile(r"v1(?:beta)?/models/([^/:]+):streamGenerateContent")
GEMINI = {
    "content_type": "text/event-stream",
    "prompt_tokens": 7,
    "before": [],
    "token": ('data: {"candidates": [{"content": {"parts": [{"text": "{text}"}],"role": "model"},'
              '"index": 0}],"usageMetadata": {"promptTokenCount": {prompt_tokens},'
              '"candidatesTokenCount": {count},"totalTokenCount": {total}},'
              '"modelVersion": "{model}"}\r\n\r\n'),
    "after": [],
}
# Bedrock's streaming operations, served here only, in AWS's binary event stream
# (tests/support/aws_event_stream.py): invoke-with-response-stream carries the
# model's own events (Anthropic's) base64 in "chunk" messages; converse-stream
# its own events, the usage in the last (metadata). The token count and pacing
# come in the body's extra fields (converse's in additionalModelRequestFields).
BEDROCK_PATH = re.compile(r"model/([^/]+)/(invoke-with-response-stream|converse-stream)")
BEDROCK_PROMPT_TOKENS = 7
# Claude on Vertex AI: Anthropic's Messages API and SSE, the model in the path.
VERTEX_PATH = re.compile(r"v1/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/([^/:]+)"
                         r":streamRawPredict")
PLACEHOLDER = re.compile(r"\{(\w+)\}")
LOG = open(os.environ.get("STREAM_SHAPES_LOG") or sys.argv[1], "a")  # noqa: SIM115 - the server's lifetime
app = FastAPI()


def fill(template: str, values: dict) -> str:
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def unary_answer(path: str, body: dict, prompt_tokens: int) -> dict:
    """A non-streamed answer in the API's own shape (OpenAI chat completion, Anthropic message)."""
    text, tokens = " ".join(f"word{i}" for i in range(body["tokens"])), body["tokens"]
    if path == "/v1/messages":
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": tokens}}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                      "total_tokens": prompt_tokens + tokens}}


def first_attempt(request: Request) -> bool:
    """Neither the Stainless SDKs' retry count nor the AWS SDKs' attempt number says it is a retry."""
    return (request.headers.get("x-stainless-retry-count", "0") == "0"
            and not re.search(r"attempt=([2-9]|\d\d)", request.headers.get("amz-sdk-request", "")))


def bedrock(path: str, operation: str, body: dict, request: Request) -> Response:
    """A Bedrock streaming answer, or its throttling of a first attempt (as Bedrock sends it)."""
    fields = {**body, **body.get("additionalModelRequestFields", {})}
    peer_port = request.client.port if request.client else None
    if fields.get("fail_first_status") and first_attempt(request):
        LOG.write(json.dumps({"peer_port": peer_port, "path": "/" + path, "status": 429}) + "\n")
        LOG.flush()
        return JSONResponse({"message": "Too many requests, please wait before trying again."},
                            status_code=429,
                            headers={"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/"})
    texts = [f"{fields['prompt'][:24]} {i}" for i in range(fields["tokens"])]
    if operation == "converse-stream":
        messages = aws_event_stream.converse_events(texts, BEDROCK_PROMPT_TOKENS)
        before, tokens, after = messages[:1], messages[1:-3], messages[-3:]
    else:
        model_events = aws_event_stream.anthropic_events(texts, BEDROCK_PROMPT_TOKENS)
        chunks = [aws_event_stream.chunk(e) for e in model_events]
        before, tokens, after = chunks[:3], chunks[3:-3], chunks[-3:]

    async def messages_out():
        token_ns, written_ns = [], []
        for message in before:
            yield message
        for message in tokens:
            await asyncio.sleep(fields["interval_ms"] / 1000)
            token_ns.append(time.monotonic_ns())
            yield message
            written_ns.append(time.monotonic_ns())
        for message in after:
            yield message
        LOG.write(json.dumps({"peer_port": peer_port, "path": "/" + path, "token_ns": token_ns,
                              "token_written_ns": written_ns}) + "\n")
        LOG.flush()

    return StreamingResponse(messages_out(), media_type="application/vnd.amazon.eventstream",
                             headers={"x-amzn-RequestId": "6f1c0d2e-test",
                                      "x-amzn-bedrock-content-type": "application/json"})


@app.post("/{path:path}")
async def stream(path: str, request: Request) -> Response:
    on_bedrock = BEDROCK_PATH.fullmatch(path)
    if on_bedrock:
        return bedrock(path, on_bedrock.group(2), await request.json(), request)
    gemini, vertex = GEMINI_PATH.fullmatch(path), VERTEX_PATH.fullmatch(path)
    shape = GEMINI if gemini else SHAPES["/v1/messages"] if vertex else SHAPES.get("/" + path)
    if shape is None:
        return Response(status_code=404)
    body = await request.json()
    if gemini or vertex:
        body["model"] = (gemini or vertex).group(1)
    if body.get("stall_first_ms") and request.headers.get("x-stainless-retry-count", "0") == "0":
        # A first attempt that gets no byte for a while: the SDK's own timeout and retry fire.
        await asyncio.sleep(body["stall_first_ms"] / 1000)
    if body.get("fail_first_status") and request.headers.get("x-stainless-retry-count", "0") == "0":
        # A first attempt answered whole with an error status (503 overloaded, 429 throttled):
        # the SDK reads the answer, backs off and retries.
        LOG.write(json.dumps({"peer_port": request.client.port if request.client else None,
                              "path": "/" + path, "status": body["fail_first_status"]}) + "\n")
        LOG.flush()
        return JSONResponse({"error": {"message": "overloaded, try again", "type": "overloaded"}},
                            status_code=body["fail_first_status"], headers={"retry-after": "0"})
    values = {"model": body["model"], "tokens": body["tokens"], "prompt_tokens": shape["prompt_tokens"]}
    peer_port = request.client.port if request.client else None
    if body.get("stream") is False:  # an SDK's unary call: the whole answer as one JSON body
        await asyncio.sleep(body["tokens"] * body["interval_ms"] / 1000)
        LOG.write(json.dumps({"peer_port": peer_port, "path": "/" + path, "token_ns": [], "unary": True})
                  + "\n")
        LOG.flush()
        return JSONResponse(unary_answer("/" + path, body, shape["prompt_tokens"]))

    async def events():
        token_ns, written_ns = [], []
        for event in shape["before"]:
            yield fill(event, values)
        for i in range(body["tokens"]):
            await asyncio.sleep(body["interval_ms"] / 1000)
            values["text"] = f"{body['prompt'][:24]} {i}"
            values["count"], values["total"] = i + 1, shape["prompt_tokens"] + i + 1
            token_ns.append(time.monotonic_ns())
            yield fill(shape["token"], values)
            # Starlette asks for the next chunk once its send() of this one returned, and uvicorn
            # writes (or SSL_writes) in send(): the write's other bound.
            written_ns.append(time.monotonic_ns())
        for event in shape["after"]:
            yield fill(event, values)
        LOG.write(json.dumps({"peer_port": peer_port, "path": "/" + path, "token_ns": token_ns,
                              "token_written_ns": written_ns}) + "\n")
        LOG.flush()

    return StreamingResponse(events(), media_type=shape["content_type"])


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is printed: a client may connect at once (uvicorn's own
    # listen() comes later, in its start-up, and only sets the backlog again).
    sock.listen(2048)
    print(sock.getsockname()[1], flush=True)
    cert, key = os.environ.get("STREAM_SHAPES_TLS_CERT"), os.environ.get("STREAM_SHAPES_TLS_KEY")
    tls = {"ssl_certfile": cert, "ssl_keyfile": key} if cert and key else {}
    # keep-alive past a recorder's start-up (uvicorn closes idle connections after 5 s);
    # no proxy headers: behind a proxy that sends X-Forwarded-For (Go's ReverseProxy), uvicorn
    # would give the forwarded address as the client, port 0, and the log is of the socket
    config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=75, proxy_headers=False, **tls)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
