#!/usr/bin/env python3
"""Fake OpenAI-style streaming completion server: ground truth for tracer tests.

Usage::

    python tests/servers/sse_server.py --host 127.0.0.1 --port 0 --log server_log.jsonl

Once listening it prints exactly one line ``LISTENING <host>:<port>`` to stdout.

Every request appends one JSON line to ``--log`` when it finishes, carrying
``time.monotonic_ns()`` timestamps (CLOCK_MONOTONIC, the same clock that
``bpf_ktime_get_ns()`` reads) taken immediately before the server hands each
piece of the response to the kernel.  A tracer under test should observe the
corresponding send syscalls shortly *after* these timestamps.

Wire behaviour worth knowing (aiohttp 3.x, CPython 3.11, checked with strace):

* ``StreamResponse.prepare()`` sends the status line + headers right away in
  their own ``sendto(2)`` (``_send_headers_immediately``); ``web.Response`` /
  ``json_response`` instead coalesce headers and body into one ``sendto(2)``.
* Each ``await resp.write(payload)`` with chunked encoding becomes exactly one
  ``sendto(2)`` carrying ``<hex len>\\r\\n<payload>\\r\\n`` (aiohttp joins the
  pieces before ``transport.write``; asyncio sends immediately when its write
  buffer is empty).  TCP_NODELAY is set by aiohttp, so each event leaves as
  its own segment.
* ``write_eof()`` sends the terminating ``0\\r\\n\\r\\n`` in one more ``sendto(2)``.
  The last token, ``[DONE]`` and the terminator leave microseconds apart, so a
  client usually receives all three in a single ``recv()``.
* The log line is written (a ``write(2)`` on the log fd) only after the last
  response byte was handed to the kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import IO, Any

from aiohttp import ClientConnectionResetError, web

DEFAULT_MAX_TOKENS = 8
DEFAULT_INTERVAL_MS = 5.0

# Exceptions that mean "the client went away" while we were sleeping or writing.
_DISCONNECT_ERRORS = (ConnectionResetError, ClientConnectionResetError, BrokenPipeError)


class BadRequest(Exception):
    """Client sent something we refuse; becomes a 400 JSON error."""


class RequestLog:
    """Append-only JSONL log; one line per finished request, flushed per line
    so tests can tail it while the server is still running."""

    def __init__(self, path: str | None) -> None:
        # Kept open for the server's lifetime (closed in close()), hence no `with`.
        self._f: IO[str] | None = (
            open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        )

    def write(self, record: dict[str, Any]) -> None:
        if self._f is None:
            return
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()

    def write_after_response(self, record: dict[str, Any]) -> None:
        """Log from a handler's exit path, but only once the response is out.

        For non-streaming replies aiohttp sends headers+body *after* the handler
        returns, in the same task step; deferring with call_soon keeps the log
        file write(2) (and its latency) off the response path.
        """
        asyncio.get_running_loop().call_soon(self.write, record)

    def close(self) -> None:
        if self._f is not None:
            self._f.flush()
            self._f.close()
            self._f = None


def _new_record(request: web.Request, t_received_ns: int) -> dict[str, Any]:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return {
        "request_id": request.headers.get("X-Request-Id"),
        "method": request.method,
        "path": request.path,
        # Not in the minimal schema, but lets tests tie requests to a TCP
        # connection (keep-alive reuse, tracer 4-tuples).
        "peer": f"{peer[0]}:{peer[1]}" if peer else None,
        "status": None,
        "stream": False,
        "outcome": None,
        "t_received_ns": t_received_ns,
        "t_headers_ns": None,
        "t_chunk_ns": [],
        "t_done_ns": None,
        "t_eof_ns": None,
        "t_response_ns": None,
        "n_tokens": 0,
    }


def _error_response(record: dict[str, Any], status: int, message: str) -> web.Response:
    record["status"] = status
    record["outcome"] = "error"
    body = {"error": {"message": message, "code": status}}
    record["t_response_ns"] = time.monotonic_ns()
    return web.json_response(body, status=status)


def _parse_request(payload: Any, chat: bool) -> dict[str, Any]:
    """Validate the JSON body; returns normalised parameters or raises BadRequest."""
    if not isinstance(payload, dict):
        raise BadRequest("body must be a JSON object")

    if chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("missing 'messages'")
        parts = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise BadRequest("each message needs a string 'content'")
            parts.append(m["content"])
        prompt = " ".join(parts)
    else:
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("missing 'prompt'")

    max_tokens = payload.get("max_tokens", DEFAULT_MAX_TOKENS)
    # bool is an int subclass; reject it explicitly.
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise BadRequest("'max_tokens' must be a non-negative integer")

    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")

    interval = payload.get("interval_ms", DEFAULT_INTERVAL_MS)
    intervals = interval if isinstance(interval, list) else [interval]
    for v in intervals:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise BadRequest("'interval_ms' must be a non-negative number or list of them")
    if not intervals:
        intervals = [DEFAULT_INTERVAL_MS]
    # A list gives the delay before each token; if it is shorter than
    # max_tokens its last value repeats, extra values are ignored.
    delays_s = [float(intervals[min(i, len(intervals) - 1)]) / 1000.0 for i in range(max_tokens)]

    forced = payload.get("status")
    if forced is not None and (not isinstance(forced, int) or isinstance(forced, bool)):
        raise BadRequest("'status' must be an integer")

    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
        "delays_s": delays_s,
        "forced_status": forced,
    }


def _tokens(prompt: str, n: int) -> list[str]:
    """The "generated" text: the prompt's words, cycled, one word per token.
    Anything placed in the prompt therefore shows up in the completion too."""
    words = prompt.split() or ["token"]
    return [words[i % len(words)] for i in range(n)]


def _event_bytes(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class CompletionServer:
    def __init__(self, log: RequestLog) -> None:
        self.log = log
        self._seq = 0

    def _next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq}"

    async def health(self, request: web.Request) -> web.Response:
        record = _new_record(request, time.monotonic_ns())
        record["status"] = 200
        record["outcome"] = "complete"
        record["t_response_ns"] = time.monotonic_ns()
        self.log.write_after_response(record)
        return web.json_response({"status": "ok"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, chat=True)

    async def _handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        record = _new_record(request, time.monotonic_ns())
        try:
            try:
                payload = json.loads(await request.read())
            except (ValueError, UnicodeDecodeError):
                return _error_response(record, 400, "invalid JSON body")
            try:
                params = _parse_request(payload, chat)
            except BadRequest as e:
                return _error_response(record, 400, str(e))

            forced = params["forced_status"]
            if forced is not None and forced >= 400:
                return _error_response(record, forced, f"forced status {forced}")

            record["stream"] = params["stream"]
            words = _tokens(params["prompt"], params["max_tokens"])
            if params["stream"]:
                return await self._stream(request, record, words, params["delays_s"], chat)
            return await self._unary(request, record, words, params["delays_s"], chat)
        except asyncio.CancelledError:
            # Server shutdown (or handler cancellation if it were enabled).
            record["outcome"] = "aborted"
            raise
        except Exception:
            if record["outcome"] is None:
                record["status"] = 500
                record["outcome"] = "error"
            raise
        finally:
            if record["outcome"] is None:
                record["outcome"] = "aborted"
            self.log.write_after_response(record)

    async def _stream(
        self,
        request: web.Request,
        record: dict[str, Any],
        words: list[str],
        delays_s: list[float],
        chat: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        # No Content-Length, HTTP/1.1 -> aiohttp would pick chunked anyway; be explicit.
        resp.enable_chunked_encoding()
        record["status"] = 200
        cid = self._next_id("chatcmpl" if chat else "cmpl")
        try:
            # prepare() sends status line + headers (StreamResponse does not
            # buffer them until the first body write).
            record["t_headers_ns"] = time.monotonic_ns()
            await resp.prepare(request)

            for word, delay in zip(words, delays_s, strict=True):
                await asyncio.sleep(delay)
                if chat:
                    obj = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": {"content": word + " "}}],
                    }
                else:
                    obj = {
                        "id": cid,
                        "object": "text_completion",
                        "choices": [{"index": 0, "text": word + " "}],
                    }
                payload = _event_bytes(obj)
                # Timestamp immediately before the write: with an empty asyncio
                # write buffer, resp.write() reaches sendto(2) synchronously,
                # so t is a tight lower bound of the syscall entry time.
                t = time.monotonic_ns()
                await resp.write(payload)
                record["t_chunk_ns"].append(t)
                record["n_tokens"] += 1

            t = time.monotonic_ns()
            await resp.write(b"data: [DONE]\n\n")
            record["t_done_ns"] = t

            t = time.monotonic_ns()
            await resp.write_eof()
            record["t_eof_ns"] = t
        except _DISCONNECT_ERRORS:
            record["outcome"] = "aborted"
            return resp
        record["outcome"] = "complete"
        return resp

    async def _unary(
        self,
        request: web.Request,
        record: dict[str, Any],
        words: list[str],
        delays_s: list[float],
        chat: bool,
    ) -> web.Response:
        await asyncio.sleep(sum(delays_s))
        text = "".join(w + " " for w in words)
        if chat:
            body = {
                "id": self._next_id("chatcmpl"),
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"completion_tokens": len(words)},
            }
        else:
            body = {
                "id": self._next_id("cmpl"),
                "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": {"completion_tokens": len(words)},
            }
        record["status"] = 200
        record["n_tokens"] = len(words)
        transport = request.transport
        # handler_cancellation is off, so a client that left during the sleep
        # does not cancel us; detect it so the log tells the truth.
        record["outcome"] = "aborted" if transport is None or transport.is_closing() else "complete"
        resp = web.json_response(body)
        record["t_response_ns"] = time.monotonic_ns()
        return resp


def build_app(log: RequestLog) -> web.Application:
    srv = CompletionServer(log)
    app = web.Application()
    app.router.add_get("/health", srv.health)
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat_completions)
    return app


async def serve(host: str, port: int, log_path: str | None) -> None:
    log = RequestLog(log_path)
    # access_log=None: no per-request logging work/syscalls beyond our own log.
    runner = web.AppRunner(build_app(log), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        bound_host, bound_port = runner.addresses[0][:2]
        sys.stdout.write(f"LISTENING {bound_host}:{bound_port}\n")
        sys.stdout.flush()

        await stop.wait()
    finally:
        # Cancels handlers still running after shutdown_timeout; their
        # finally blocks log them as "aborted" before the log is closed.
        await runner.cleanup()
        await asyncio.sleep(0)  # run log writes still queued by write_after_response
        log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", default=None, help="JSONL request log (appended)")
    args = ap.parse_args(argv)
    if args.log:
        os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    asyncio.run(serve(args.host, args.port, args.log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
