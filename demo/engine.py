"""Continuous-batching engine: one thread, a waiting queue, a running batch.

Each iteration of the engine thread:

1. drops requests whose client went away (their KV reservation is freed);
2. admits waiting requests in arrival order while the running batch has room
   (``max_batch_size``), the KV cache has room (a request reserves
   ``prompt + max_tokens`` tokens when admitted, so it can never run out
   mid-generation), and the iteration's prefill token budget lasts
   (``token_budget``; the first request of an iteration is admitted even if
   its prompt alone is larger, so long prompts are not starved). The head of
   the queue blocks the rest (first come, first served, as vLLM's default);
3. prefills each admitted request (which samples its first token);
4. runs one decode step: one batched forward advancing every running request
   by one token (see runner.py for the padding and the per-request caches);
5. hands the new tokens to the API side and retires finished requests.

The API side (server.py, an asyncio thread) and this thread share ``lock``,
which guards the queue, the batch and every request's output, as in real
servers; it is never held across a forward pass. The engine wakes the API
through each request's ``notify`` callback, and sleeps on a condition of the
same lock when there is nothing to do.

Every USDT probe of the contract (notes: probes/ and docs/demo-server.md)
fires here, except request_start and, for requests the engine does not end
itself, request_end (server.py fires those).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

from inferprobe.probes import usdt

log = logging.getLogger("inferprobe.demo")


class Status(IntEnum):
    """request_end's status argument."""

    OK = 0
    ABORTED = 1  # the client disconnected
    ERROR = 2  # the server failed
    REJECTED = 3  # bad input, too long


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 8
    token_budget: int = 512  # prompt tokens prefilled per iteration
    kv_capacity_tokens: int = 8192


@dataclass(eq=False)
class Request:
    req_id: int
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    # Called from the engine thread after new output or the end; must not block.
    notify: Callable[[], object] = lambda: None  # its result is ignored
    # Guarded by Engine.lock:
    state: str = "new"  # new -> waiting -> running -> done
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | error | abort
    cancelled: bool = False
    ended: bool = False  # request_end fired
    kv_reserved: int = 0
    # Engine thread only (set by the runner):
    kv: Any = None
    rng: Any = None

    @property
    def reservation(self) -> int:
        return len(self.prompt_ids) + self.max_tokens


class Runner(Protocol):
    def prefill(self, req: Request) -> int: ...
    def decode(self, reqs: list[Request]) -> list[int]: ...
    def free(self, req: Request) -> None: ...


class Engine:
    def __init__(self, runner: Runner, config: EngineConfig, eos_ids: Iterable[int]) -> None:
        self.runner = runner
        self.config = config
        self.eos_ids = frozenset(eos_ids)
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.kv_used = 0
        self._stopping = False
        self._step_id = 0
        # Counters for /stats, guarded by lock.
        self.decode_steps = 0
        self.prefills = 0
        self.tokens_generated = 0
        self.batch_sizes: Counter[int] = Counter()
        self.finished: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._loop, name="demo-engine", daemon=True)

    # ------------------------------------------------------------ API side

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self.lock:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)

    def submit(self, req: Request) -> None:
        with self.lock:
            req.state = "waiting"
            self.waiting.append(req)
            depth = len(self.waiting)
            self._wake.notify()
        usdt.request_queued(req.req_id, depth)

    def abort(self, req: Request) -> bool:
        """The client went away. True if the engine still held the request and will end it."""
        with self.lock:
            if req.state in ("waiting", "running"):
                req.cancelled = True
                self._wake.notify()
                return True
            return False

    def end(self, req: Request, status: Status) -> None:
        """Fire request_end once per request, whoever gets there first."""
        with self.lock:
            if req.ended:
                return
            req.ended = True
            produced = len(req.output_ids)
        usdt.request_end(req.req_id, produced, int(status))

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "waiting": len(self.waiting),
                "running": len(self.running),
                "kv_used_tokens": self.kv_used,
                "kv_capacity_tokens": self.config.kv_capacity_tokens,
                "max_batch_size": self.config.max_batch_size,
                "token_budget": self.config.token_budget,
                "decode_steps": self.decode_steps,
                "prefills": self.prefills,
                "tokens_generated": self.tokens_generated,
                "max_batch_size_seen": max(self.batch_sizes, default=0),
                "decode_batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "finished": dict(self.finished),
            }

    # ------------------------------------------------------------ engine thread

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self._stopping and not self.waiting and not self.running:
                    self._wake.wait()
                if self._stopping:
                    failed = self._fail_locked(self.running + list(self.waiting), "error")
                    break
                dropped = self._drop_cancelled_locked()
                admitted = self._admit_locked()
                waiting, running, kv_used = len(self.waiting), len(self.running), self.kv_used
            for req, batch_size in admitted:
                usdt.request_scheduled(req.req_id, batch_size)
            self._retire(dropped)
            usdt.queue_depth(waiting, running)
            usdt.kv_usage(kv_used, self.config.kv_capacity_tokens)
            try:
                for req, _ in admitted:
                    self._prefill(req)
                self._decode_step()
            except Exception:
                # Never log the request itself: prompts and completions are private.
                log.exception("engine step failed; failing the running requests")
                with self.lock:
                    failed = self._fail_locked(list(self.running), "error")
                self._retire(failed)
        self._retire(failed)

    def _drop_cancelled_locked(self) -> list[Request]:
        dropped = [r for r in self.running if r.cancelled] + [r for r in self.waiting if r.cancelled]
        if dropped:
            self.running = [r for r in self.running if not r.cancelled]
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
            for req in dropped:
                self._finish_locked(req, "abort")
        return dropped

    def _admit_locked(self) -> list[tuple[Request, int]]:
        cfg = self.config
        budget = cfg.token_budget
        admitted: list[tuple[Request, int]] = []
        while self.waiting and len(self.running) < cfg.max_batch_size:
            req = self.waiting[0]
            if self.kv_used + req.reservation > cfg.kv_capacity_tokens:
                break
            if admitted and len(req.prompt_ids) > budget:
                break
            self.waiting.popleft()
            req.state = "running"
            req.kv_reserved = req.reservation
            self.kv_used += req.kv_reserved
            self.running.append(req)
            budget -= len(req.prompt_ids)
            admitted.append((req, len(self.running)))
        return admitted

    def _prefill(self, req: Request) -> None:
        n = len(req.prompt_ids)
        usdt.prefill_start(req.req_id, n)
        token = self.runner.prefill(req)
        usdt.prefill_end(req.req_id, n)
        with self.lock:
            self.prefills += 1
        self._deliver([(req, token)])

    def _decode_step(self) -> None:
        with self.lock:
            batch = [r for r in self.running if r.output_ids and not r.cancelled]
        if not batch:
            return
        self._step_id += 1
        size = len(batch)
        # Tokens the step's attention covers: every request's cached context plus its new token.
        tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r in batch)
        usdt.decode_step_start(self._step_id, size, tokens)
        new = self.runner.decode(batch)
        usdt.decode_step_end(self._step_id, size, tokens)
        with self.lock:
            self.decode_steps += 1
            self.batch_sizes[size] += 1
        self._deliver(list(zip(batch, new, strict=True)))

    def _deliver(self, produced: list[tuple[Request, int]]) -> None:
        """Hand sampled tokens to the API side; retire requests that finished."""
        emitted: list[tuple[int, int]] = []
        done: list[Request] = []
        with self.lock:
            for req, token in produced:
                if req.state != "running" or req.cancelled:
                    continue  # dropped at the next iteration's start
                if token in self.eos_ids:
                    self._finish_locked(req, "stop")
                else:
                    req.output_ids.append(token)
                    self.tokens_generated += 1
                    emitted.append((req.req_id, len(req.output_ids) - 1))
                    if len(req.output_ids) >= req.max_tokens:
                        self._finish_locked(req, "length")
                if req.state == "done":
                    done.append(req)
            if done:
                self.running = [r for r in self.running if r.state != "done"]
        for req_id, index in emitted:
            usdt.token_emit(req_id, index)
        for req in done:
            self.runner.free(req)
        for req, _ in produced:
            req.notify()

    def _finish_locked(self, req: Request, reason: str) -> None:
        req.state = "done"
        req.finish_reason = reason
        self.kv_used -= req.kv_reserved
        req.kv_reserved = 0
        self.finished[reason] += 1

    def _fail_locked(self, reqs: list[Request], reason: str) -> list[Request]:
        for req in reqs:
            if req.state != "done":
                self._finish_locked(req, reason)
        self.running = [r for r in self.running if r.state != "done"]
        self.waiting = deque(r for r in self.waiting if r.state != "done")
        return reqs

    def _retire(self, reqs: list[Request]) -> None:
        """Free what the engine dropped; it ends aborted requests itself (status 1)."""
        for req in reqs:
            self.runner.free(req)
            if req.finish_reason == "abort":
                self.end(req, Status.ABORTED)
            req.notify()
