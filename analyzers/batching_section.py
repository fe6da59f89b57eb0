"""The report's batching section and its verdict finding, from BatchingAdvice.

The same section is what `inferprobe advise` prints (with the setting it
chose for the target), so the terminal, HTML, Markdown and JSON outputs all
show one computed model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferprobe.analyzers.batching import BatchingAdvice
from inferprobe.analyzers.batching_replay import Prediction
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.sections import (
    AnalysisInput,
    AnalyzerResult,
    AnalyzerSection,
    ScatterChart,
    Table,
    source_states,
)
from inferprobe.analyzers.units import ms, ms_text

ANCHOR = "analyzer-batching"
# A setting that moves a p99 by at least this share of today's is worth a finding.
WORTH_SAYING = 0.20
TERM_UNITS = {"decode_seqs": "a sequence decoded", "prefill_tokens": "a prompt token",
              "prefill_seqs": "a prompt in the step", "context_tokens": "1,000 cached positions attended"}


def _cost(term: str, coef_ns: float) -> str:
    per = coef_ns * 1000 if term == "context_tokens" else coef_ns
    return ms(per, 3, unit=True)


def model_table(advice: BatchingAdvice) -> Table:
    assert advice.model is not None
    rows = []
    for fitted in (advice.model.step, advice.model.prefill):
        if fitted is None:
            continue
        rows.append((fitted.what, "fixed cost", ms(fitted.intercept_ns, 3, unit=True)))
        rows.extend((fitted.what, f"per {TERM_UNITS.get(t, t)}", _cost(t, c))
                    for t, c in zip(fitted.terms, fitted.coef_ns, strict=True))
        rows.append((fitted.what, "cross-validated error (median / p90)",
                     f"{fitted.cv_median_error:.0%} / {fitted.cv_p90_error:.0%} over {fitted.samples}"))
    return Table(caption="Step-time model (fitted on this recording)", columns=("model", "term", "cost"),
                 rows=tuple(rows))


def _row(advice: BatchingAdvice, p: Prediction, label: str) -> tuple[str, ...]:
    assert advice.engine is not None
    notes = []
    if label:
        notes.append(label)
    if advice.extrapolated(p.setting):
        notes.append("beyond the batch sizes recorded")
    if advice.target is not None and advice.target.met_by(p):
        notes.append("meets the target")
    return (advice.engine.flag(p.setting), ms(p.ttft_ns.p50), ms(p.ttft_ns.p99), ms(p.itl_ns.p50),
            ms(p.itl_ns.p99), ms(p.queue_ns.p99), f"{p.tokens_per_s:.1f}", ", ".join(notes))


def sweep_table(advice: BatchingAdvice) -> Table:
    assert advice.trace is not None and advice.measured is not None and advice.engine is not None
    m = advice.measured
    current = f"{advice.engine.flag(advice.trace.current)} (measured)"
    rows: list[tuple[str, ...]] = [(current, ms(m.ttft_ns.p50), ms(m.ttft_ns.p99), ms(m.itl_ns.p50),
                                    ms(m.itl_ns.p99), ms(m.queue_ns.p99), f"{m.tokens_per_s:.1f}",
                                    "recorded")]
    for p in advice.predictions:
        label = "recorded setting" if p.setting == advice.trace.current else ""
        if advice.chosen is not None and p.setting == advice.chosen.setting:
            label = ", ".join(x for x in (label, "advised" if advice.meets else "closest to the target") if x)
        rows.append(_row(advice, p, label))
    return Table(caption="What-if replay of this recording's requests (ms; tokens/s)",
                 columns=("setting", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "queue p99", "tokens/s",
                          "note"), rows=tuple(rows))


def chart(advice: BatchingAdvice) -> ScatterChart | None:
    if advice.chart is None or not advice.chart.points:
        return None
    return ScatterChart(title="Step time against batch size", x_label="sequences decoded in the step",
                        y_label="time to the next step (ms)", points=advice.chart.points,
                        line=advice.chart.fit, line_label="fitted model")


def advice_sentence(advice: BatchingAdvice) -> str | None:
    """The answer to the target, in the engine's own flag."""
    if advice.target is None or advice.chosen is None or advice.engine is None or advice.trace is None:
        return None
    c = advice.chosen
    predicted = f"p99 TTFT {ms_text(c.ttft_ns.p99)}, p99 ITL {ms_text(c.itl_ns.p99)}"
    if not advice.meets:
        last = advice.predictions[-1].setting
        return (f"No setting from {advice.engine.flag(1)} to {advice.engine.flag(last)} "
                f"meets the target on this workload; the closest is {advice.engine.flag(c.setting)} "
                f"({predicted} predicted): the engine needs more capacity (another replica, a faster "
                f"device).")
    same = c.setting == advice.trace.current
    return (f"Run with {advice.engine.flag(c.setting)}"
            + (" (as recorded)" if same else f" instead of {advice.engine.flag(advice.trace.current)}")
            + f": predicted {predicted}, {c.tokens_per_s:.1f} tokens/s, the highest throughput that meets "
            f"the target.")


def section(advice: BatchingAdvice, meta: Mapping[str, Any]) -> AnalyzerSection:
    sources = source_states(meta, ["usdt", "llama"])
    if advice.cannot is not None or advice.model is None:
        return AnalyzerSection(anchor=ANCHOR, title="Batching", sources=sources,
                               summary="How the engine's batch cap sets TTFT and ITL, from a step-time "
                                       "model fitted on this recording and a replay of its requests.",
                               notes=(f"No batching model: {advice.cannot}.",))
    notes = []
    if (sentence := advice_sentence(advice)) is not None:
        notes.append(sentence)
    notes.extend(f"Support: {s}." for s in advice.support)
    scatter = chart(advice)
    assert advice.engine is not None
    return AnalyzerSection(
        anchor=ANCHOR, title="Batching",
        summary=f"The {advice.engine.name}'s step time fitted against what each step carried, and this "
                f"recording's requests replayed at each {advice.engine.knob} ({advice.engine.knob_meaning}); "
                f"`inferprobe advise FILE --ttft-p99 ... --itl-p99 ...` picks the setting for a target.",
        sources=sources, tables=(model_table(advice), sweep_table(advice)),
        scatters=(scatter,) if scatter is not None else (), notes=tuple(notes))


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


def analyze(inp: AnalysisInput) -> AnalyzerResult | None:
    advice = inp.batching
    if advice is None or (advice.engine is None and advice.cannot is not None):
        return None
    found = finding(advice)
    return AnalyzerResult(section=section(advice, inp.recording.meta),
                          findings=(found,) if found is not None else ())
