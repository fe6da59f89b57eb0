"""The scheduler with a stand-in model: admission by batch size, token budget and KV capacity.

No torch here: the runner below returns fixed tokens, so these pin down the
scheduling rules themselves, in milliseconds. The real model runs in
test_server.py.
"""

from __future__ import annotations

import threading

from inferprobe.demo.engine import Engine, EngineConfig, Request

EOS = 0


class FakeRunner:
    """Emits token 7 forever; a gate lets a test hold the engine inside a decode step."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Semaphore(1000)

    def prefill(self, req: Request) -> int:
        req.kv = object()
        return 7

    def decode(self, reqs: list[Request]) -> list[int]:
        self.gate.acquire()
        self.batches.append(len(reqs))
        return [7] * len(reqs)

    def free(self, req: Request) -> None:
        req.kv = None


def make(max_batch=8, budget=512, kv=8192):
    runner = FakeRunner()
    return Engine(runner, EngineConfig(max_batch, budget, kv), [EOS]), runner


def request(n_prompt: int, max_tokens: int) -> tuple[Request, threading.Event]:
    done = threading.Event()
    req = Request(1, [5] * n_prompt, max_tokens)
    req.notify = lambda: req.state == "done" and done.set()
    return req, done


def test_kv_capacity_makes_requests_wait():
    engine, runner = make(kv=100)
    a, a_done = request(40, 20)  # reserves 60
    b, b_done = request(30, 20)  # 50 more would exceed 100: waits for a
    runner.gate = threading.Semaphore(0)
    engine.submit(a)
    engine.submit(b)
    engine.start()
    try:
        for _ in range(3):
            runner.gate.release()
        snap = _wait(engine, lambda s: s["decode_steps"] >= 2)
        assert (snap["running"], snap["waiting"], snap["kv_used_tokens"]) == (1, 1, 60)
        for _ in range(200):
            runner.gate.release()
        assert a_done.wait(5) and b_done.wait(5)
        assert a.finish_reason == b.finish_reason == "length"
        assert len(a.output_ids) == len(b.output_ids) == 20
        assert max(runner.batches) == 1  # never together
        assert engine.snapshot()["kv_used_tokens"] == 0
    finally:
        engine.stop()


def test_batch_size_and_token_budget():
    engine, runner = make(max_batch=2, budget=50)
    reqs = [request(30, 5) for _ in range(3)]
    for req, _ in reqs:
        engine.submit(req)
    engine.start()
    try:
        assert all(done.wait(5) for _, done in reqs)
        # Budget 50 admits one 30-token prompt per iteration; batch size caps at 2.
        assert max(runner.batches) == 2
        assert engine.snapshot()["prefills"] == 3
    finally:
        engine.stop()


def test_abort_frees_kv():
    engine, runner = make()
    runner.gate = threading.Semaphore(0)
    req, done = request(10, 50)
    engine.submit(req)
    engine.start()
    try:
        runner.gate.release()
        _wait(engine, lambda s: s["decode_steps"] >= 1)
        assert engine.abort(req)
        runner.gate.release()
        assert done.wait(5) and req.finish_reason == "abort" and req.kv is None
        snap = _wait(engine, lambda s: s["running"] == 0)
        assert snap["kv_used_tokens"] == 0
        assert not engine.abort(req)  # already gone: the caller ends it itself
    finally:
        runner.gate.release(1000)
        engine.stop()


def _wait(engine: Engine, cond, timeout: float = 5.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = engine.snapshot()
        if cond(snap):
            return snap
        time.sleep(0.005)
    raise AssertionError(engine.snapshot())
