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


@app.post("/{path:path}")
async def stream(path: str, request: Request) -> Response:
    gemini = GEMINI_PATH.fullmatch(path)
    shape = GEMINI if gemini else SHAPES.get("/" + path)
    if shape is None:
        return Response(status_code=404)
    body = await request.json()
    if gemini:
        body["model"] = gemini.group(1)
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
