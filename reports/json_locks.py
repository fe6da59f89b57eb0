"""The lock fields of `report --format json` (docs/report-json.md, docs/locks.md)."""

from __future__ import annotations

from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.locks import ContendedLock, LockAnalysis
from inferprobe.collector.model.timeline import Request

MAX_FRAMES = 12


def request_fields(r: Request, locks: LockAnalysis | None) -> dict:
    """Per request: null values when the recording had no lock tracing."""
    span = locks.of(r) if locks is not None and locks.enabled else None
    if locks is None or span is None:
        return {"mutex_wait_ratio": None, "mutex_flagged": None, "lock_wait": None}
    return {
        "mutex_wait_ratio": round(span.ratio, 4),
        "mutex_flagged": locks.flagged(r),
        "lock_wait": {
            "span_ns": span.span_ns,
            "lock_wait_ns": span.lock_wait_ns,
            "gil_wait_ns": span.gil_wait_ns,
            "handoff_wait_ns": span.handoff_wait_ns,
            "unknown_wait_ns": span.unknown_wait_ns,
            "runqueue_ns": span.runqueue_ns,
            "offcpu_ns": span.offcpu_ns,
            "top_lock": span.top_lock,
        },
    }


def lock_json(lk: ContendedLock) -> dict:
    return {
        "pid": lk.pid,
        "address": lk.uaddr,
        "kind": lk.kind.value,
        "waits": lk.waits,
        "total_wait_ns": lk.total_wait_ns,
        "p99_wait_ns": lk.p99_wait_ns,
        "max_wait_ns": lk.max_wait_ns,
        "all_waits": lk.all_waits,
        "all_wait_ns": lk.all_wait_ns,
        "waiter_frames": list(lk.waiter_frames[:MAX_FRAMES]),
        "waker_frames": list(lk.waker_frames[:MAX_FRAMES]),
        "classified_by": lk.how,
    }


def top_level(locks: LockAnalysis | None) -> dict:
    if locks is None or not locks.enabled:
        return {"locks": None, "lock_summary": None}
    return {
        "locks": [lock_json(lk) for lk in locks.locks],
        "lock_summary": {
            "mutex_threshold": locks.threshold,
            "decode_steps": decode_steps_json(locks),
            "waits_by_kind": locks.waits_by_kind,
            "kernel_counters": locks.counters,
            "settings": locks.settings,
        },
    }


def decode_steps_json(locks: LockAnalysis) -> dict | None:
    """The scheduler-cycle spans: the engine thread during each USDT decode step."""
    if not locks.steps:
        return None
    ratios = sorted(span.ratio for _, span in locks.steps)
    flagged = [(step, span) for step, span in locks.steps if span.ratio > locks.threshold]
    flagged.sort(key=lambda item: -item[1].ratio)
    return {
        "count": len(ratios),
        "flagged": len(flagged),
        "ratio_p50": percentile(ratios, 50),
        "ratio_p99": percentile(ratios, 99),
        "worst": [{"pid": step.pid, "tid": step.tid, "step_id": step.step_id, "t_start_ns": step.t_start_ns,
                   "duration_ns": span.span_ns, "mutex_wait_ratio": round(span.ratio, 4),
                   "top_lock": span.top_lock} for step, span in flagged[:20]],
    }
