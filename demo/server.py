"""The demo server's HTTP side: an OpenAI-compatible API on aiohttp.

Routes: POST /v1/completions and /v1/chat/completions (streaming as SSE, one
``data:`` event per token, or one JSON body with ``usage``), GET /health,
GET /stats (engine counters, e.g. the decode batch sizes seen), GET /v1/models.

Each request gets an integer id: the client's ``X-Request-Id`` when that is a
decimal integer (so a test can join the tracer's view with its own),
otherwise the next value of a counter. The id is what the USDT probes carry
and what the response ``id`` (``cmpl-<id>``) shows. request_start carries the
fd of the request's socket, to tie the probe events to the socket trace.

Prompts and completions are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import signal
import socket
import time
from dataclasses import dataclass

from aiohttp import web

from inferprobe.collector.errors import InferprobeError
from inferprobe.demo import protocol
from inferprobe.demo.engine import Engine, Request, Status
from inferprobe.probes import usdt

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_REQUEST_ID = 2**63 - 1  # the probes' arguments are signed 64-bit


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens_limit: int = 512


def bind(host: str, port: int) -> socket.socket:
    """Bind before the model loads, so a busy port fails in a second, not after 20."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise InferprobeError(f"cannot resolve --host {host!r}: {err.strerror}", exit_code=2) from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise InferprobeError(f"port {port} on {host} is already in use; stop what listens there "
                                  "or pick another port with --port") from None
        raise InferprobeError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.setblocking(False)
    return sock


class DemoApi:
    def __init__(self, engine: Engine, tokenizer, model_name: str, limits: protocol.Limits) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.limits = limits
        self._ids = itertools.count(1)
        self.outcomes: dict[str, int] = {s.name.lower(): 0 for s in Status}
        self.started = time.time()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    # ------------------------------------------------------------ small routes

    async def health(self, _request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        return web.json_response({"status": "ok", "model": self.model_name,
                                  **{k: snap[k] for k in ("waiting", "running", "kv_used_tokens",
                                                          "kv_capacity_tokens")}})

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response({**self.engine.snapshot(), "requests": dict(self.outcomes)})

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": int(self.started),
             "owned_by": "inferprobe-demo"}]})

    # ------------------------------------------------------------ completions

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    def _request_id(self, request: web.Request) -> int:
        sent = request.headers.get("X-Request-Id", "")
        if sent.isascii() and sent.isdigit() and int(sent) <= MAX_REQUEST_ID:
            return int(sent)
        return next(self._ids)

    def _encode(self, prompt: str | list[dict]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        return list(self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _count(self, status: Status) -> None:
        self.outcomes[status.name.lower()] += 1

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        req_id = self._request_id(request)
        conn_fd = _socket_fd(request)
        try:
            raw = await request.read()
            parsed = protocol.parse(raw, chat=chat, limits=self.limits, encode=self._encode)
        except (protocol.BadRequest, web.HTTPRequestEntityTooLarge) as err:
            bad = err if isinstance(err, protocol.BadRequest) else protocol.BadRequest(
                f"the request body is larger than {MAX_BODY_BYTES} bytes")
            usdt.request_end(req_id, 0, int(Status.REJECTED))
            self._count(Status.REJECTED)
            return web.json_response(bad.body(), status=400, headers={"X-Request-Id": str(req_id)})

        usdt.request_start(req_id, len(parsed.prompt_ids), conn_fd)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        seed = parsed.seed if parsed.seed is not None else req_id
        req = Request(req_id, parsed.prompt_ids, parsed.max_tokens, parsed.temperature, seed,
                      notify=lambda: loop.call_soon_threadsafe(woken.set))
        meta = protocol.Meta.new(chat, req_id, self.model_name)
        self.engine.submit(req)
        status = Status.ABORTED
        try:
            if parsed.stream:
                response, status = await self._stream(request, req, parsed, meta, woken)
            else:
                response, status = await self._unary(req, parsed, meta, woken)
            return response
        finally:
            # On disconnect (handler cancelled, or a failed write) the engine
            # drops the request at its next iteration, frees its KV and fires
            # request_end(1) itself; otherwise the request ends here.
            if not (status is Status.ABORTED and self.engine.abort(req)):
                self.engine.end(req, status)
            self._count(status)

    async def _next(self, req: Request, sent: int, woken: asyncio.Event) -> tuple[list[int], str | None]:
        """Wait for tokens past ``sent``; returns them and the finish reason once done."""
        while True:
            await woken.wait()
            woken.clear()
            with self.engine.lock:
                new = req.output_ids[sent:]
                reason = req.finish_reason if req.state == "done" else None
            if new or reason:
                return new, reason

    async def _stream(self, request: web.Request, req: Request, parsed: protocol.Parsed,
                      meta: protocol.Meta, woken: asyncio.Event) -> tuple[web.StreamResponse, Status]:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Request-Id": str(req.req_id)})
        try:
            return await self._write_stream(request, response, req, parsed, meta, woken)
        except ConnectionResetError:
            # The client went away between two writes (aiohttp raises a
            # subclass of this); the caller hands the request back.
            return response, Status.ABORTED

    async def _write_stream(self, request: web.Request, response: web.StreamResponse, req: Request,
                            parsed: protocol.Parsed, meta: protocol.Meta,
                            woken: asyncio.Event) -> tuple[web.StreamResponse, Status]:
        await response.prepare(request)
        detok = protocol.Detokenizer(self._decode)
        sent = 0
        reason = None
        while reason is None:
            new, reason = await self._next(req, sent, woken)
            for token in new:
                # One write per token: the token leaves as soon as it exists.
                await _event(response, protocol.chunk(meta, detok.add(token), None, first=sent == 0))
                sent += 1
        if reason == "error":
            await _event(response, protocol.error_body("the engine failed while generating"))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response, Status.ERROR
        await _event(response, protocol.chunk(meta, detok.flush(), reason, first=sent == 0))
        if parsed.include_usage:
            await _event(response, protocol.usage_chunk(meta, len(req.prompt_ids), sent))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response, Status.OK

    async def _unary(self, req: Request, parsed: protocol.Parsed, meta: protocol.Meta,
                     woken: asyncio.Event) -> tuple[web.Response, Status]:
        reason = None
        while reason is None:
            _, reason = await self._next(req, 0, woken)
        with self.engine.lock:
            ids = list(req.output_ids)
        headers = {"X-Request-Id": str(req.req_id)}
        if reason == "error":
            return web.json_response(protocol.error_body("the engine failed while generating"),
                                     status=500, headers=headers), Status.ERROR
        body = protocol.full(meta, self._decode(ids), reason, len(req.prompt_ids), len(ids))
        return web.json_response(body, headers=headers), Status.OK


async def _event(response: web.StreamResponse, obj: dict) -> None:
    await response.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _socket_fd(request: web.Request) -> int:
    """The request socket's fd (-1 if unknown), with Nagle off so token writes leave at once."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None:
        return -1
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock.fileno()


async def run(api: DemoApi, sock: socket.socket, on_ready) -> None:
    """Serve on an already bound socket until SIGINT or SIGTERM."""
    # handler_cancellation: a client that disconnects cancels its handler, so
    # a request still waiting in the queue is dropped, not generated for nobody.
    runner = web.AppRunner(api.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    on_ready()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
