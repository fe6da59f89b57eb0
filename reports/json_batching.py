"""The batching model in the JSON report and `inferprobe advise --format json`."""

from __future__ import annotations

from inferprobe.analyzers.batching import BatchingAdvice
from inferprobe.analyzers.batching_replay import Prediction
from inferprobe.analyzers.step_model import LinearFit
from inferprobe.reports.sections.batching import advice_sentence


def _fit(f: LinearFit | None) -> dict | None:
    if f is None:
        return None
    return {"what": f.what, "intercept_ns": round(f.intercept_ns),
            "coefficients_ns": {t: c for t, c in zip(f.terms, f.coef_ns, strict=True)},
            "left_out": list(f.dropped), "samples": f.samples,
            "cv_median_error": round(f.cv_median_error, 4), "cv_p90_error": round(f.cv_p90_error, 4)}


def _prediction(p: Prediction) -> dict:
    return {"setting": p.setting, "ttft_ns": p.ttft_ns.as_dict(), "itl_ns": p.itl_ns.as_dict(),
            "queue_ns": p.queue_ns.as_dict(), "tokens_per_s": round(p.tokens_per_s, 2),
            "requests": p.requests}


def batching_json(a: BatchingAdvice) -> dict:
    out: dict = {"engine": a.engine.name if a.engine else None, "flag": a.engine.knob if a.engine else None,
                 "cannot": a.cannot}
    if a.model is None or a.trace is None or a.measured is None:
        return out
    m = a.measured
    out.update({
        "current_setting": a.trace.current,
        "current_setting_binding": a.trace.current_binding,
        "batch_sizes_seen": list(a.batch_sizes_seen),
        "step_model": _fit(a.model.step),
        "prefill_model": _fit(a.model.prefill),
        "constant_ns": {"before_engine": a.trace.before_engine_ns,
                        "engine_to_wire": a.trace.engine_to_wire_ns,
                        "response_tail": a.trace.tail_ns},
        "measured": {"ttft_ns": m.ttft_ns.as_dict(), "itl_ns": m.itl_ns.as_dict(),
                     "queue_ns": m.queue_ns.as_dict(),
                     "tokens_per_s": round(m.tokens_per_s, 2)},
        "predictions": [dict(_prediction(p), extrapolated=a.extrapolated(p.setting)) for p in a.predictions],
        "chart": {"points": [list(p) for p in a.chart.points], "fit": [list(p) for p in a.chart.fit]}
        if a.chart else None,
        "target": None if a.target is None else {"ttft_p99_ns": a.target.ttft_p99_ns,
                                                  "itl_p99_ns": a.target.itl_p99_ns},
        "advised": None if a.chosen is None else {"setting": a.chosen.setting, "meets_target": a.meets,
                                                  "flag": a.engine.flag(a.chosen.setting)
                                                  if a.engine else None,
                                                  "sentence": advice_sentence(a)},
        "support": list(a.support),
    })
    return out
