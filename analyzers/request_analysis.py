"""What the analyzers found about one request, kept beside it (not in it).

Its phases and batch sizes for the JSON report; its mutex.wait.ratio and its lock and GPU
waits for the JSON report and the span and metric exporters. Those come
from the locks and GPU analyzers, which need the whole recording, so a
recording's report model holds one RequestAnalysis per request and the
exporters take it next to the Request: the Request itself stays what the
collector built. The live path has no analysis: it passes none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.decompose import phases_ns
from inferprobe.analyzers.itl_phases import itl_phases_ns
from inferprobe.collector.model.timeline import Request, WaitInterval

if TYPE_CHECKING:  # the live exporters import this module; they need none of the analyzers
    from inferprobe.analyzers.client_calls import Attempt
    from inferprobe.analyzers.gpu import GpuSummary
    from inferprobe.analyzers.locks import LockAnalysis


@dataclass(frozen=True)
class RequestAnalysis:
    phases_ns: dict[str, int] = field(default_factory=dict)  # analyzers/decompose.py, in order
    itl_phases_ns: dict[str, int] | None = None  # analyzers/itl_phases.py; None: ITL not split
    batch_size_p50: int | None = None  # of the decode steps it took part in (USDT)
    mutex_wait_ratio: float | None = None  # None: no lock span for it (locks set off, or no time)
    # None: the probe set was off, so the waits are unknown; () : it was on and saw none.
    lock_waits: tuple[WaitInterval, ...] | None = None  # locks set: lock and GIL waits, by start
    gpu_waits: tuple[WaitInterval, ...] | None = None  # gpu set: sync calls and synchronous copies
    # CUPTI shim (analyzers/gpu_execution.py): GPU execution of the work its steps launched. None: no shim
    # records for it; gpu_execution: the GPU's busy intervals (kind "gpu_execution"), by start.
    gpu_busy_ns: int | None = None
    gpu_idle_ns: int | None = None
    gpu_execution: tuple[WaitInterval, ...] | None = None
    client: Attempt | None = None  # an outbound call's attempt: call, number, connection (client_calls.py)


NONE = RequestAnalysis()


def per_request(requests: Sequence[Request], locks: LockAnalysis | None,
                gpu: GpuSummary | None, attempts: dict[int, Attempt] | None = None) -> list[RequestAnalysis]:
    """One RequestAnalysis per request, in the order of `requests`."""
    gpu_waits = {g.index: g.wait_intervals for g in gpu.requests} if gpu is not None else {}
    executed = {x.index: x for x in gpu.execution.requests} if gpu is not None and gpu.execution else {}
    out = []
    for i, r in enumerate(requests):
        x = executed.get(i)
        span = locks.of(r) if locks is not None else None
        lock_waits = None
        if locks is not None and locks.enabled:
            lock_waits = span.lock_waits if span is not None else ()
        out.append(RequestAnalysis(
            phases_ns=phases_ns(r),
            itl_phases_ns=itl_phases_ns(r),
            batch_size_p50=percentile([st.batch_size for st in r.server.steps], 50) if r.server else None,
            mutex_wait_ratio=span.ratio if span is not None else None,
            lock_waits=lock_waits,
            gpu_waits=gpu_waits.get(i),
            gpu_busy_ns=x.gpu.busy_ns if x else None,
            gpu_idle_ns=x.gpu.idle_ns if x else None,
            gpu_execution=tuple(WaitInterval(a, b, "gpu_execution", "GPU busy") for a, b in x.gpu.busy)
            if x else None,
            client=(attempts or {}).get(id(r)),
        ))
    return out
