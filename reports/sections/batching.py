"""The report's batching section, from BatchingAdvice (its verdict finding is
analyzers/batching.py's).

The same section is what `inferprobe advise` prints (with the setting it
chose for the target), so the terminal, HTML, Markdown and JSON outputs all
show one computed model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.batching import ANCHOR, BatchingAdvice, shown
from inferprobe.analyzers.batching_replay import Prediction
from inferprobe.analyzers.units import ms, ms_text
from inferprobe.reports.sections.model import AnalyzerSection, ScatterChart, Table, source_states

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


def build(inp: AnalysisInput) -> AnalyzerSection | None:
    advice = inp.batching
    return section(advice, inp.recording.meta) if shown(advice) else None
