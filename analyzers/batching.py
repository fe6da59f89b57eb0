"""Batching advice: the step-time model, the what-if sweep, and the setting
that meets a latency target, computed once from a recording.

Everything `advise` and the report's batching section show is here, in
BatchingAdvice; reports/ and cli/ only draw it. The parts:
  engine_iterations.py  the engine's turns and the workload, read from the recording
  step_model.py         the fitted step time and its cross-validated error
  batching_replay.py    the workload replayed at each batch cap
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeGuard

from inferprobe.analyzers.batching_replay import Prediction, StepModel, replay
from inferprobe.analyzers.cadence import Distribution, percentile
from inferprobe.analyzers.engine_iterations import (
    MIXED,
    Engine,
    EngineTrace,
    Iteration,
    engine_of,
    peak_overlap,
    read_trace,
)
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.step_model import MIN_BATCH_SIZES, CannotFit, fit
from inferprobe.analyzers.units import ms_text
from inferprobe.collector.ingest.server_view import ServerView
from inferprobe.collector.model.timeline import Request

ANCHOR = "analyzer-batching"  # the report section (reports/sections/batching.py)
# A setting that moves a p99 by at least this share of today's is worth a finding.
WORTH_SAYING = 0.20
MAX_SETTING = 64  # the sweep's ceiling: no engine here batches more sequences a step than this
# Requests one replay sends at most: 5 replicas x up to 64 settings of them keep `report` to
# seconds on an agent's busy ring segment.
MAX_REPLAY_REQUESTS = 2000
MIXED_TERMS = ("decode_seqs", "prefill_tokens", "prefill_seqs", "context_tokens")
DECODE_TERMS = ("decode_seqs", "context_tokens", "prefill_seqs")
PREFILL_TERMS = ("prefill_tokens",)
# Where no step timeline was recorded: what would have given one.
NO_STEPS = ("the recording has no engine step timeline: record a llama.cpp server (the llama probe set "
            "attaches by itself) or a server with inferprobe's USDT probes (the usdt set); vLLM's "
            "steps are not read yet")


@dataclass(frozen=True)
class Target:
    ttft_p99_ns: int | None = None
    itl_p99_ns: int | None = None

    def met_by(self, p: Prediction) -> bool:
        return ((self.ttft_p99_ns is None or (p.ttft_ns.p99 or 0) <= self.ttft_p99_ns)
                and (self.itl_p99_ns is None or (p.itl_ns.p99 or 0) <= self.itl_p99_ns))

    def excess(self, p: Prediction) -> float:
        """How far a prediction misses, as the largest ratio of predicted to target."""
        ratios = [(p.ttft_ns.p99 or 0) / self.ttft_p99_ns] if self.ttft_p99_ns else []
        ratios += [(p.itl_ns.p99 or 0) / self.itl_p99_ns] if self.itl_p99_ns else []
        return max(ratios, default=0.0)


@dataclass(frozen=True)
class Measured:
    """The recording's own figures for the requests the replay sends."""

    ttft_ns: Distribution
    itl_ns: Distribution
    queue_ns: Distribution
    tokens_per_s: float


@dataclass(frozen=True)
class ChartPoints:
    """Step time against batch size: the recorded turns without prefill, and the fit."""

    points: tuple[tuple[int, float], ...]  # (sequences decoded, turn ms)
    fit: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class BatchingAdvice:
    engine: Engine | None
    cannot: str | None = None  # why there is no model: one sentence
    model: StepModel | None = None
    trace: EngineTrace | None = None
    batch_sizes_seen: tuple[int, ...] = ()
    measured: Measured | None = None
    predictions: tuple[Prediction, ...] = ()  # one per setting swept, the current one included
    chart: ChartPoints | None = None
    target: Target | None = None
    chosen: Prediction | None = None  # the setting that meets the target at the best throughput
    meets: bool = False  # chosen meets the target (else it is the closest)
    support: tuple[str, ...] = field(default_factory=tuple)  # how far the recording supports it

    @property
    def current(self) -> Prediction | None:
        if self.trace is None:
            return None
        return next((p for p in self.predictions if p.setting == self.trace.current), None)

    def extrapolated(self, setting: int) -> bool:
        return bool(self.batch_sizes_seen) and setting > max(self.batch_sizes_seen)


def _features(it: Iteration) -> dict[str, float]:
    return {"decode_seqs": it.decode_seqs, "prefill_tokens": it.prefill_tokens,
            "prefill_seqs": it.prefill_seqs, "context_tokens": it.context_tokens}


def fit_steps(trace: EngineTrace) -> StepModel:
    busy = [it for it in trace.iterations if it.cycle_ns is not None and it.decode_seqs + it.prefill_seqs > 0]
    if trace.engine.shape == MIXED:
        return StepModel(fit("step", [_features(it) for it in busy], [float(it.cycle_ns or 0) for it in busy],
                             MIXED_TERMS, group="decode_seqs"))
    turns = [it for it in busy if it.decode_seqs > 0]
    decode = fit("decode turn", [_features(it) for it in turns],
                 [float((it.cycle_ns or 0) - (it.prefill_ns or 0)) for it in turns], DECODE_TERMS,
                 group="decode_seqs")
    # One prefill a sample: the turns that prefilled exactly one request say what one costs.
    single = [it for it in busy if it.prefill_seqs == 1 and it.prefill_ns]
    prefill = fit("prefill", [{"prefill_tokens": it.prefill_tokens} for it in single],
                  [float(it.prefill_ns or 0) for it in single], PREFILL_TERMS)
    return StepModel(decode, prefill)


def measured_of(trace: EngineTrace, requests: Sequence[Request]) -> Measured:
    tied = [r for r in requests if r.role == "server" and r.server is not None
            and r.server.t_scheduled_ns is not None and r.server.t_end_ns is not None]
    queue = []
    for r in tied:
        assert r.server is not None and r.server.t_scheduled_ns is not None
        ready = r.server.t_queued_ns if r.server.t_queued_ns is not None else r.t_ingress_ns + \
            trace.before_engine_ns
        queue.append(max(0, r.server.t_scheduled_ns - ready))
    tokens = sum(len(r.token_ns) for r in tied)
    first = min((r.t_ingress_ns for r in tied), default=0)
    last = max((r.token_ns[-1] for r in tied if r.token_ns), default=0)
    return Measured(Distribution.of([t for r in tied if (t := r.ttft_ns) is not None]),
                    Distribution.of([g for r in tied for g in r.itl_ns]), Distribution.of(queue),
                    tokens / ((last - first) / 1e9) if last > first else 0.0)


def _chart(trace: EngineTrace, model: StepModel) -> ChartPoints:
    plain = [it for it in trace.iterations if it.cycle_ns is not None and it.decode_seqs > 0
             and (it.prefill_tokens == 0 if trace.engine.shape == MIXED else True)]
    points = tuple(sorted((it.decode_seqs, ((it.cycle_ns or 0) - (it.prefill_ns or 0)) / 1e6)
                          for it in plain))
    per_seq = percentile([it.context_tokens / it.decode_seqs for it in plain], 50) or 0.0
    sizes = sorted({b for b, _ in points})
    line = tuple((b, model.step.typical({"decode_seqs": b, "context_tokens": b * per_seq}) / 1e6)
                 for b in range(1, (sizes[-1] if sizes else 1) + 1))
    return ChartPoints(points, line)


def _choose(predictions: Sequence[Prediction], target: Target,
            recorded_max: int | None = None) -> tuple[Prediction | None, bool]:
    """The best throughput that meets the target among the settings the recording saw batches
    of; where only larger settings meet it, the smallest of those (a prediction is surest
    nearest what was recorded); where none meets it, the one that misses by the least."""
    meeting = [p for p in predictions if target.met_by(p)]
    seen = [p for p in meeting if recorded_max is None or p.setting <= recorded_max]
    if seen:
        # the best throughput; of equals, the smallest cap (less memory held)
        return max(seen, key=lambda p: (round(p.tokens_per_s, 1), -p.setting)), True
    if meeting:
        return min(meeting, key=lambda p: p.setting), True
    closest = min(predictions, key=lambda p: (target.excess(p), p.setting), default=None)
    return closest, False


def _support(trace: EngineTrace, model: StepModel, sizes: Sequence[int], measured: Measured,
             current: Prediction | None) -> tuple[str, ...]:
    lines = [f"{model.step.samples} engine turns with the engine busy, at {len(sizes)} batch sizes "
             f"({sizes[0]}-{sizes[-1]}); the {model.step.what} model's cross-validated error is "
             f"{model.step.cv_median_error:.0%} median, {model.step.cv_p90_error:.0%} p90"]
    if model.prefill is not None:
        lines.append(f"{model.prefill.samples} single prefills; their model's cross-validated error is "
                     f"{model.prefill.cv_median_error:.0%} median")
    if current is not None and measured.ttft_ns.p99 and measured.itl_ns.p99:
        d_ttft = (current.ttft_ns.p99 or 0) / measured.ttft_ns.p99 - 1
        d_itl = (current.itl_ns.p99 or 0) / measured.itl_ns.p99 - 1
        lines.append(f"replayed at the recorded setting, p99 TTFT comes out {d_ttft:+.0%} and p99 ITL "
                     f"{d_itl:+.0%} against what was measured")
    lines.append(f"the recorded setting, {trace.engine.flag(trace.current)}, is the most requests the "
                 f"engine held at once" + ("" if trace.current_binding else
                                           ", and no request waited for a place: the real cap may be higher"))
    for fitted in (model.step, model.prefill):
        if fitted is not None and fitted.dropped:
            lines.append(f"left out of the {fitted.what} model: {'; '.join(fitted.dropped)}")
    if trace.untied:
        lines.append(f"{trace.untied} served POST(s) could not be tied to the engine's view and are not "
                     f"replayed")
    return tuple(lines)


def advise(view: ServerView, requests: Sequence[Request], target: Target | None = None,
           current: int | None = None) -> BatchingAdvice:
    trace = read_trace(view, requests)
    if trace is None:
        return BatchingAdvice(engine_of(view), cannot=NO_STEPS, target=target)
    if current is not None:
        trace = _with_current(trace, current)
    if not trace.work:
        return BatchingAdvice(trace.engine, cannot="no served request was tied to the engine's steps, so "
                              "there is no workload to replay", trace=trace, target=target)
    sizes = tuple(sorted({it.decode_seqs for it in trace.iterations if it.cycle_ns is not None
                          and it.decode_seqs > 0}))
    if len(sizes) < MIN_BATCH_SIZES:
        return BatchingAdvice(trace.engine, cannot=(
            f"the engine decoded at {len(sizes)} batch size(s) only "
            f"({', '.join(map(str, sizes)) or 'none'}), "
            f"and the cost of one more sequence needs {MIN_BATCH_SIZES}: record under a load whose "
            f"concurrency varies (clients starting one after another do)"), trace=trace,
            batch_sizes_seen=sizes, target=target)
    try:
        model = fit_steps(trace)
    except CannotFit as err:
        return BatchingAdvice(trace.engine, cannot=str(err), trace=trace, batch_sizes_seen=sizes,
                              target=target)
    # The fit reads every step; the replay, run five times at each setting, sends at most
    # MAX_REPLAY_REQUESTS (the first, in arrival order, with their clients' chains intact),
    # and what was measured is read over the same requests.
    replayed = replace(trace, work=sorted(trace.work, key=lambda w: w.arrival_ns)[:MAX_REPLAY_REQUESTS])
    last_arrival = replayed.work[-1].arrival_ns
    measured = measured_of(replayed, [r for r in requests if r.t_ingress_ns <= last_arrival])
    top = max(trace.current, _peak_in_flight(requests, last_arrival))
    predictions = tuple(replay(replayed, model, s) for s in range(1, min(MAX_SETTING, top) + 1))
    if trace.current > MAX_SETTING:
        predictions += (replay(replayed, model, trace.current),)
    chosen, meets = _choose(predictions, target, max(sizes)) if target is not None else (None, False)
    current_p = next((p for p in predictions if p.setting == trace.current), None)
    support = _support(trace, model, sizes, measured, current_p)
    if len(replayed.work) < len(trace.work):
        support += (f"the replay sends the first {len(replayed.work)} of the {len(trace.work)} requests, "
                    f"and the measured figures are of those (a longer replay would slow the report)",)
    return BatchingAdvice(trace.engine, model=model, trace=replayed, batch_sizes_seen=sizes,
                          measured=measured, predictions=predictions, chart=_chart(trace, model),
                          target=target, chosen=chosen,
                          meets=meets, support=support)


def _peak_in_flight(requests: Sequence[Request], until_ns: int) -> int:
    """The most served requests open at once (read, response not yet ended) up to until_ns: a
    cap above it changes nothing, since no more ever wait at once (a closed loop keeps one a
    client in flight)."""
    return peak_overlap([(r.t_ingress_ns, r.t_end_ns if r.t_end_ns is not None else until_ns)
                          for r in requests if r.role == "server" and r.t_ingress_ns <= until_ns])


def _with_current(trace: EngineTrace, current: int) -> EngineTrace:
    return replace(trace, current=current, current_binding=True)


def shown(advice: BatchingAdvice | None) -> TypeGuard[BatchingAdvice]:
    """Whether the report says anything of batching: there is advice, or at least an engine
    it could not model (and why)."""
    return advice is not None and not (advice.engine is None and advice.cannot is not None)


def _p99(p: Prediction, name: str) -> float | None:
    return p.ttft_ns.p99 if name == "TTFT" else p.itl_ns.p99


def finding(advice: BatchingAdvice) -> Finding | None:
    """Batching is a cause when another cap would move a p99 by a fifth or more (without a
    target to weigh TTFT against ITL, each is weighed alone)."""
    current = advice.current
    if current is None or advice.engine is None or advice.measured is None:
        return None
    best: tuple[float, Prediction, str, str, str] | None = None  # gain, setting, name, other, of
    for p in advice.predictions:
        for name, other, of in (("TTFT", "ITL", "p99 TTFT"), ("ITL", "TTFT", "p99 inter-token latency")):
            now, then = _p99(current, name), _p99(p, name)
            if now and then is not None and not advice.extrapolated(p.setting):
                gain = (now - then) / now
                if gain >= WORTH_SAYING and (best is None or gain > best[0]):
                    best = (gain, p, name, other, of)
    if best is None:
        return None
    gain, p, name, other, of = best
    e = advice.engine
    sentence = (f"batching: replayed at {e.flag(p.setting)} instead of {e.flag(current.setting)}, this "
                f"recording's requests would see p99 {name} {ms_text(_p99(p, name))} instead of "
                f"{ms_text(_p99(current, name))} (p99 {other} {ms_text(_p99(current, other))} -> "
                f"{ms_text(_p99(p, other))})")
    return Finding(kind="batching.setting", sentence=sentence, source="batching",
                   recommendation=f"weigh TTFT against ITL with `inferprobe advise FILE --ttft-p99 T "
                                  f"--itl-p99 T`: it names the {e.knob} that meets both at the best "
                                  f"throughput",
                   share=min(1.0, gain), of=of, evidence=ANCHOR,
                   figures={"setting": p.setting, "current": current.setting})
