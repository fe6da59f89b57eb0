"""What-if replay: the recorded workload through a continuous-batching engine
at another batch cap, its steps timed by the fitted step-time model.

The engine it simulates (docs/advise.md says where real engines differ):
- first come, first served: a request waits until a turn starts with a free
  place in the batch, then joins it; nothing is preempted;
- "mixed steps": each step carries one token of every generating sequence
  and the prompt tokens of the sequences in prefill, up to the step's token
  budget; a prompt's last step samples its first token;
- "prefill, then decode": a turn prefills the requests it admitted one after
  another, each sampling its first token, then decodes all running requests;
- every step's time is the model's, times a ratio drawn from the measured
  steps' own (measured / fitted) of the same batch size (step_model.py), so
  the spread of real steps, not only their mean, reaches the predicted tails.
  The draws are seeded: the same recording always gives the same prediction.

Clients are replayed as recorded (engine_iterations.py says how a client's
requests are told): a request that followed another of its client is sent
its recorded pause after the replayed response ended (a closed loop), ready
for the engine as long before or after the next step's start as it was in
the recording (its race with that step, engine_iterations._ready_after_next_step);
a client's first request at its recorded time.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from inferprobe.analyzers.cadence import Distribution
from inferprobe.analyzers.engine_iterations import MIXED, EngineTrace, WorkItem
from inferprobe.analyzers.step_model import LinearFit

# llama-server's default logical batch (-b 2048): the prompt tokens one step can carry.
STEP_TOKEN_BUDGET = 2048
SEED = 20261203
REPLICAS = 5


@dataclass(frozen=True)
class StepModel:
    """The fits a replay times its steps with: one for a mixed step; for a prefill-then-decode
    turn, one per prefill and one for the decode step and the rest of the turn."""

    step: LinearFit  # mixed: the whole step; prefill-then-decode: the decode part of a turn
    prefill: LinearFit | None = None


@dataclass
class _Seq:
    item: WorkItem
    ready_ns: float
    admitted_ns: float = 0.0
    prompt_left: int = 0
    tokens_left: int = 0
    generated: int = 0
    token_ns: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Prediction:
    setting: int
    ttft_ns: Distribution  # ingress -> first token on the wire
    itl_ns: Distribution  # between consecutive tokens
    queue_ns: Distribution  # ready for the engine -> admitted
    tokens_per_s: float
    requests: int


class _Draw:
    def __init__(self, fit: LinearFit, rng: random.Random) -> None:
        self.fit, self.rng = fit, rng

    def __call__(self, features: dict[str, float]) -> float:
        base = max(0.0, self.fit.predict(features))
        ratios = self.fit.ratios_for(features)
        return base * (self.rng.choice(ratios) if ratios else 1.0)


class _Between:
    """The engine's time between a step's compute end and the next step's start, drawn from
    the recording's (EngineTrace.between_steps_ns): after a step that ends a request, from
    those measured after such steps."""

    def __init__(self, trace: EngineTrace, rng: random.Random) -> None:
        after_end, others = trace.between_steps_ns
        self.after_end, self.others, self.rng = after_end or others, others or after_end, rng

    def __call__(self, ends: bool) -> float:
        gaps = self.after_end if ends else self.others
        return float(self.rng.choice(gaps)) if gaps else 0.0


def replay(trace: EngineTrace, model: StepModel, setting: int) -> Prediction:
    """The workload at one setting, replayed REPLICAS times with other draws: each figure is
    the median of the replicas', so one unlucky draw does not decide a p99."""
    runs = [_replay_once(trace, model, setting, random.Random(SEED + i)) for i in range(REPLICAS)]
    return Prediction(setting, _median_of([r.ttft_ns for r in runs]), _median_of([r.itl_ns for r in runs]),
                      _median_of([r.queue_ns for r in runs]),
                      statistics.median_high(r.tokens_per_s for r in runs), runs[0].requests)


def _median_of(dists: list[Distribution]) -> Distribution:
    def mid(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median_high(known) if known else None

    return Distribution(dists[0].count, mid([d.p50 for d in dists]), mid([d.p90 for d in dists]),
                        mid([d.p99 for d in dists]), mid([d.max for d in dists]))


def _replay_once(trace: EngineTrace, model: StepModel, setting: int, rng: random.Random) -> Prediction:
    step_time = _Draw(model.step, rng)
    between = _Between(trace, rng)
    prefill_time = _Draw(model.prefill, rng) if model.prefill is not None else None
    mixed = trace.engine.shape == MIXED
    followers: dict[int, list[WorkItem]] = {}
    pending: list[tuple[float, int, _Seq]] = []  # (ready, key, seq)
    t0 = min((w.arrival_ns for w in trace.work), default=0)

    def send(item: WorkItem, at: float) -> None:
        ready(item, at + trace.before_engine_ns)

    def ready(item: WorkItem, at: float) -> None:
        seq = _Seq(item, at, prompt_left=item.prompt_tokens, tokens_left=item.output_tokens)
        heapq.heappush(pending, (seq.ready_ns, item.key, seq))

    # a client's first request at its recorded time, its next ones as its responses end
    for item in sorted(trace.work, key=lambda w: w.arrival_ns):
        if item.after is None:
            send(item, item.arrival_ns - t0)
        else:
            followers.setdefault(item.after, []).append(item)
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    done: list[_Seq] = []
    t = 0.0
    guard = 50 * (sum(w.output_tokens for w in trace.work) + len(trace.work)) + 1000
    while guard > 0 and (pending or waiting or running):
        guard -= 1
        while pending and pending[0][0] <= t:
            waiting.append(heapq.heappop(pending)[2])
        if not waiting and not running:
            t = pending[0][0]
            continue
        admitted = []
        while waiting and len(running) < setting:
            seq = waiting.popleft()
            seq.admitted_ns = t
            running.append(seq)
            admitted.append(seq)
        if mixed:
            t = _mixed_step(running, t, step_time, between)
        else:
            assert prefill_time is not None
            t = _prefill_then_decode(running, admitted, t, step_time, prefill_time, between)
        for seq in [s for s in running if s.tokens_left <= 0]:
            running.remove(seq)
            done.append(seq)
            end = seq.token_ns[-1] + trace.engine_to_wire_ns + trace.tail_ns
            for nxt in followers.pop(seq.item.key, ()):
                if nxt.ready_after_step_ns is not None:  # the race with the next step, as run
                    ready(nxt, t + nxt.ready_after_step_ns)
                else:
                    send(nxt, end + nxt.think_ns)
    return _predict(trace, setting, done)


def _mixed_step(running: list[_Seq], t: float, step_time: _Draw, between: _Between) -> float:
    decode = [s for s in running if s.prompt_left == 0 and s.tokens_left > 0]
    budget = STEP_TOKEN_BUDGET - len(decode)
    chunks = []
    for s in running:
        if s.prompt_left > 0 and budget > 0:
            take = min(s.prompt_left, budget)
            budget -= take
            chunks.append((s, take))
    context = sum(s.item.prompt_tokens - s.prompt_left + s.generated for s in running) + len(decode) + sum(
        take for _, take in chunks)
    end = t + step_time({"decode_seqs": len(decode), "prefill_tokens": sum(k for _, k in chunks),
                         "prefill_seqs": len(chunks), "context_tokens": context})
    # the step's time runs to the next step's start; its tokens left when its compute ended
    ends = any(s.tokens_left <= 1 for s in decode) or any(s.prompt_left == take and s.tokens_left <= 1
                                                         for s, take in chunks)
    out = max(t, end - between(ends))
    for s in decode:
        _token(s, out)
    for s, take in chunks:
        s.prompt_left -= take
        if s.prompt_left == 0:
            _token(s, out)
    return end


def _prefill_then_decode(running: list[_Seq], admitted: list[_Seq], t: float, step_time: _Draw,
                         prefill_time: _Draw, between: _Between) -> float:
    for s in admitted:
        t += prefill_time({"prefill_tokens": s.prompt_left})
        s.prompt_left = 0
        _token(s, t)
    decode = [s for s in running if s.tokens_left > 0]
    if not decode:
        return t
    context = sum(s.item.prompt_tokens + s.generated for s in decode)
    end = t + step_time({"decode_seqs": len(decode), "context_tokens": context})
    out = max(t, end - between(any(s.tokens_left <= 1 for s in decode)))  # as in _mixed_step
    for s in decode:
        _token(s, out)
    return end


def _token(s: _Seq, at: float) -> None:
    s.token_ns.append(at)
    s.generated += 1
    s.tokens_left -= 1


def _predict(trace: EngineTrace, setting: int, done: list[_Seq]) -> Prediction:
    ttft: list[float] = []
    itl: list[float] = []
    queue: list[float] = []
    first, last, tokens = float("inf"), 0.0, 0
    for s in done:
        sent = s.ready_ns - trace.before_engine_ns
        ttft.append(s.token_ns[0] + trace.engine_to_wire_ns - sent)
        itl.extend(b - a for a, b in zip(s.token_ns, s.token_ns[1:], strict=False))
        queue.append(s.admitted_ns - s.ready_ns)
        first, last = min(first, sent), max(last, s.token_ns[-1])
        tokens += len(s.token_ns)
    span_s = (last - first) / 1e9 if done and last > first else 0.0
    return Prediction(setting, Distribution.of(ttft), Distribution.of(itl), Distribution.of(queue),
                      tokens / span_s if span_s else 0.0, len(done))
