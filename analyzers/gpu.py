"""GPU findings: where CPU threads waited on the GPU, how often they launched, what they copied.

Input: the gpu probe set's decoded events, its snapshot (exact kernel-side
per-function totals, launch runs still open at stop) and the request
timelines. No I/O, no bcc.

Vocabulary:
- a *wait* is time a CPU thread spent blocked on the GPU: the synchronise
  calls (stream, event, context, device, stream-wait-event) and the
  synchronous copies (cudaMemcpy, cuMemcpyDtoH, ...), entry to return;
- a *launch run* is what gpu.bpf.c sums in the kernel: the launches of one
  thread between two of its waits/copies/allocations (at most N launches or
  T ms), with the time of its first and last launch;
- a *GPU cycle* is a launch run plus the wait or copy that closed it: the
  shape of one decode step when the server has no USDT probes to say where
  its steps are.

GPU execution (what the GPU ran, not what the CPU asked for) comes from the
CUPTI shim's records when a target had it loaded: analyzers/gpu_execution.py,
kept in GpuSummary.execution.

Attribution to requests: with USDT decode steps, the calls on the step's
thread during the request's prefill and the decode steps it took part in
(a batched step's wait is shared by every request of the batch, so
per-request figures add up to more than the engine's total); without
probes, calls on the request's own threads (the one that read it and those
that wrote its response) while it was the only request in flight there.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from inferprobe.analyzers.cadence import Distribution, percentile
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.gpu_execution import GpuExecutionSummary, summarize_execution
from inferprobe.collector.model import gpu_catalog
from inferprobe.collector.model.events import (
    EventType,
    GpuCallRecord,
    GpuFenceRecord,
    GpuFlushReason,
    GpuFunction,
    GpuLaunchesRecord,
    GpuRecord,
)
from inferprobe.collector.model.gpu_catalog import Category
from inferprobe.collector.model.timeline import DecodeStep, Request, ServerRequest, WaitInterval

SYNC_BOUND_SHARE = 0.5  # steps waiting on the GPU at least this much: the GPU is the bottleneck
LAUNCH_BOUND_SHARE = 0.2  # steps waiting less than this ...
LAUNCH_BOUND_LAUNCHES = 10  # ... while making at least this many launches each: CPU-bound
MIN_STEPS_FOR_FINDING = 5

SYNCHRONOUS_COPIES = frozenset({
    GpuFunction.CU_MEMCPY, GpuFunction.CU_MEMCPY_DTOH, GpuFunction.CU_MEMCPY_HTOD,
    GpuFunction.CU_MEMCPY_DTOD, GpuFunction.CUDA_MEMCPY,
})


def is_wait(fn: GpuFunction) -> bool:
    return gpu_catalog.category(fn) == Category.WAIT or fn in SYNCHRONOUS_COPIES


@dataclass(frozen=True)
class FunctionSummary:
    name: str
    library: str
    category: str
    calls: int
    nested: int  # entered inside another hooked call (the runtime calling the driver)
    errors: int
    total_ns: int | None  # None: no return probe (driver launches)
    p99_ns: int | None
    p99_from: str | None  # "events" (exact) or "histogram" (power-of-two upper bound)
    bytes: int


class Allocations(TypedDict):
    """A process's GPU memory allocations (frees counted apart)."""

    count: int
    bytes: int
    frees: int
    per_s: float | None  # None without a wall time
    during_requests: int  # made while one of the process's requests was in flight


@dataclass(frozen=True)
class ProcessSummary:
    pid: int
    launches: int  # kernel + graph launches, outermost calls
    graph_launches: int
    launches_per_s: float | None
    wait_ns: int
    wait_share: float | None  # of wall time, for the thread that waited most
    wait_tid: int | None
    copies: dict[str, dict[str, int]]  # direction -> {"count", "bytes"}
    allocations: Allocations


@dataclass(frozen=True)
class RequestGpu:
    index: int  # position in ReportData.requests
    attributed_by: str  # "decode_steps" or "thread"
    gpu_wait_ns: int
    gpu_launches: int
    gpu_graph_launches: int
    t_first_launch_ns: int | None  # first launch after dispatch
    launch_to_first_token_ns: int | None
    wait_intervals: tuple[WaitInterval, ...] = ()  # the waits counted in gpu_wait_ns, by start


@dataclass(frozen=True)
class StepGpu:
    pid: int
    tid: int
    t_start_ns: int
    duration_ns: int
    wait_ns: int
    launches: int
    graph_launches: int


@dataclass(frozen=True)
class GpuSummary:
    sources: dict
    functions: dict[str, FunctionSummary]
    processes: list[ProcessSummary]
    requests: list[RequestGpu]
    steps_from: str | None  # "decode_steps" (USDT) or "gpu_cycles", None without any
    steps: list[StepGpu]
    fence_waits: Distribution
    findings: list[Finding] = field(default_factory=list)  # kinds: see findings()
    execution: GpuExecutionSummary | None = None  # the CUPTI shim's records; None without the shim

    @property
    def step_wait_share(self) -> float | None:
        total = sum(s.duration_ns for s in self.steps)
        return sum(s.wait_ns for s in self.steps) / total if total else None

    @property
    def step_waits(self) -> Distribution:
        return Distribution.of([s.wait_ns for s in self.steps])

    @property
    def step_launches(self) -> Distribution:
        return Distribution.of([s.launches for s in self.steps])


# -- helpers -------------------------------------------------------------------


def _runs(events: list[GpuRecord], snapshot: dict) -> list[GpuLaunchesRecord]:
    runs = [e for e in events if isinstance(e, GpuLaunchesRecord)]
    for r in snapshot.get("open_runs", []):
        runs.append(GpuLaunchesRecord(
            type=EventType.GPU_LAUNCHES, pid=r["pid"], tid=r["tid"], ts_ns=r["first_ns"],
            last_ns=r["last_ns"], launch_ns=r["launch_ns"], kernels=r["kernels"], graphs=r["graphs"],
            reason=GpuFlushReason.END))
    return sorted(runs, key=lambda r: r.ts_ns)


def _hist_p99(hist: list[int]) -> int | None:
    total = sum(hist)
    if not total:
        return None
    need = 0.99 * total
    seen = 0
    for slot, n in enumerate(hist):
        seen += n
        if seen >= need:
            return 0 if slot == 0 else 1 << slot  # slot k holds [2^(k-1), 2^k)
    return None


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


class _ThreadIndex:
    """GPU calls and launch runs of each (pid, tid), by time."""

    def __init__(self, calls: list[GpuCallRecord], runs: list[GpuLaunchesRecord]):
        self.waits: dict[tuple[int, int], list[GpuCallRecord]] = defaultdict(list)
        self.runs: dict[tuple[int, int], list[GpuLaunchesRecord]] = defaultdict(list)
        for c in calls:
            if is_wait(c.function):
                self.waits[(c.pid, c.tid)].append(c)
        for r in runs:
            self.runs[(r.pid, r.tid)].append(r)
        self._wait_starts = {k: [c.ts_ns for c in v] for k, v in self.waits.items()}
        self._run_starts = {k: [r.ts_ns for r in v] for k, v in self.runs.items()}

    def waits_in(self, key: tuple[int, int], t0: int, t1: int) -> list[WaitInterval]:
        """The thread's waits overlapping t0..t1, clipped to it."""
        calls = self.waits.get(key, [])
        hi = bisect.bisect_left(self._wait_starts.get(key, []), t1)
        out = []
        for c in reversed(calls[:hi]):
            if c.exit_ns <= t0 and c.ts_ns < t0 - 60_000_000_000:
                break  # waits are not longer than a minute: stop looking further back
            if _overlap(c.ts_ns, c.exit_ns, t0, t1):
                out.append(WaitInterval(max(c.ts_ns, t0), min(c.exit_ns, t1), "gpu",
                                        gpu_catalog.name(c.function)))
        return out

    def wait_ns(self, key: tuple[int, int], t0: int, t1: int) -> int:
        return sum(w.end_ns - w.start_ns for w in self.waits_in(key, t0, t1))

    def runs_in(self, key: tuple[int, int], t0: int, t1: int) -> list[GpuLaunchesRecord]:
        starts = self._run_starts.get(key, [])
        return self.runs.get(key, [])[bisect.bisect_left(starts, t0):bisect.bisect_left(starts, t1)]

    def first_run_after(self, keys: list[tuple[int, int]], t: int) -> GpuLaunchesRecord | None:
        best = None
        for key in keys:
            starts = self._run_starts.get(key, [])
            i = bisect.bisect_left(starts, t)
            if i < len(starts) and (best is None or starts[i] < best.ts_ns):
                best = self.runs[key][i]
        return best


# -- per function ----------------------------------------------------------------


def function_summaries(calls: list[GpuCallRecord], snapshot: dict) -> dict[str, FunctionSummary]:
    stats = snapshot.get("functions", {})
    durations: dict[GpuFunction, list[int]] = defaultdict(list)
    for c in calls:
        durations[c.function].append(c.duration_ns)
    out = {}
    for fn in GpuFunction:
        st = stats.get(fn.name)
        if st is None and fn not in durations:
            continue
        has_return = not (gpu_catalog.category(fn) == Category.LAUNCH
                          and gpu_catalog.library(fn) == gpu_catalog.Library.DRIVER)
        if durations.get(fn):
            p99, p99_from = percentile(durations[fn], 99), "events"
        elif st is not None and has_return:
            p99, p99_from = _hist_p99(st["hist_log2_ns"]), "histogram"
        else:
            p99, p99_from = None, None
        if p99 is None:
            p99_from = None
        if st is not None:
            calls_n, nested, errors, total, nbytes = (st["calls"], st["nested"], st["errors"],
                                                      st["total_ns"], st["bytes"])
        else:  # no snapshot (the recorder did not stop cleanly): what the events say
            mine = [c for c in calls if c.function == fn]
            calls_n, nested, errors = len(mine), 0, sum(c.ret != 0 for c in mine)
            total, nbytes = sum(durations[fn]), sum(c.bytes for c in mine)
        name = gpu_catalog.name(fn)
        out[name] = FunctionSummary(
            name=name, library=gpu_catalog.library(fn).value, category=gpu_catalog.category(fn).value,
            calls=calls_n, nested=nested, errors=errors, total_ns=total if has_return else None,
            p99_ns=p99, p99_from=p99_from, bytes=nbytes)
    return out


# -- per process -------------------------------------------------------------------


def _in_flight(requests: list[Request], pid: int, t: int, end_of_recording: int) -> bool:
    return any(r.pid == pid and r.t_ingress_ns <= t <= (r.t_end_ns or end_of_recording) for r in requests)


def process_summaries(calls: list[GpuCallRecord], runs: list[GpuLaunchesRecord], requests: list[Request],
                      wall_ns: int | None, end_ns: int) -> list[ProcessSummary]:
    pids = sorted({c.pid for c in calls} | {r.pid for r in runs})
    out = []
    for pid in pids:
        mine = [c for c in calls if c.pid == pid]
        my_runs = [r for r in runs if r.pid == pid]
        launches = sum(r.kernels + r.graphs for r in my_runs)
        graphs = sum(r.graphs for r in my_runs)
        wait_by_tid: dict[int, int] = defaultdict(int)
        copies: dict[str, dict[str, int]] = {}
        allocs = [c for c in mine if gpu_catalog.category(c.function) == Category.MEMORY
                  and c.function not in gpu_catalog.FREES]
        frees = [c for c in mine if c.function in gpu_catalog.FREES]
        for c in mine:
            if is_wait(c.function):
                wait_by_tid[c.tid] += c.duration_ns
            if c.copy_kind is not None:
                d = copies.setdefault(gpu_catalog.COPY_DIRECTION_NAME[c.copy_kind], {"count": 0, "bytes": 0})
                d["count"] += 1
                d["bytes"] += c.bytes
        wait_tid = max(wait_by_tid, key=wait_by_tid.__getitem__) if wait_by_tid else None
        secs = wall_ns / 1e9 if wall_ns else None
        out.append(ProcessSummary(
            pid=pid, launches=launches, graph_launches=graphs,
            launches_per_s=launches / secs if secs else None,
            wait_ns=sum(wait_by_tid.values()),
            wait_share=wait_by_tid[wait_tid] / wall_ns if wait_tid is not None and wall_ns else None,
            wait_tid=wait_tid, copies=copies,
            allocations={
                "count": len(allocs),
                "bytes": sum(c.bytes for c in allocs),
                "frees": len(frees),
                "per_s": len(allocs) / secs if secs else None,
                "during_requests": sum(_in_flight(requests, pid, c.ts_ns, end_ns) for c in allocs),
            }))
    return out


# -- steps --------------------------------------------------------------------------


def usdt_steps(steps: list[DecodeStep], index: _ThreadIndex) -> list[StepGpu]:
    out = []
    for s in steps:
        if s.t_end_ns is None:
            continue
        key = (s.pid, s.tid)
        runs = index.runs_in(key, s.t_start_ns, s.t_end_ns)
        out.append(StepGpu(pid=s.pid, tid=s.tid, t_start_ns=s.t_start_ns,
                           duration_ns=s.t_end_ns - s.t_start_ns,
                           wait_ns=index.wait_ns(key, s.t_start_ns, s.t_end_ns),
                           launches=sum(r.kernels + r.graphs for r in runs),
                           graph_launches=sum(r.graphs for r in runs)))
    return out


def gpu_cycles(calls: list[GpuCallRecord], runs: list[GpuLaunchesRecord]) -> list[StepGpu]:
    """Launch runs closed by a wait or copy, with that call: steps seen from the GPU side."""
    by_thread: dict[tuple[int, int], list[GpuCallRecord]] = defaultdict(list)
    for c in calls:
        by_thread[(c.pid, c.tid)].append(c)
    starts = {k: [c.ts_ns for c in v] for k, v in by_thread.items()}
    out = []
    for r in runs:
        if r.reason != GpuFlushReason.CALL:
            continue
        key = (r.pid, r.tid)
        i = bisect.bisect_left(starts.get(key, []), r.last_ns)
        if i >= len(starts.get(key, [])):
            continue
        closing = by_thread[key][i]
        wait = closing.duration_ns if is_wait(closing.function) else 0
        out.append(StepGpu(pid=r.pid, tid=r.tid, t_start_ns=r.ts_ns,
                           duration_ns=closing.exit_ns - r.ts_ns, wait_ns=wait,
                           launches=r.kernels + r.graphs, graph_launches=r.graphs))
    return out


# -- per request ---------------------------------------------------------------------


def _usdt_request(i: int, r: Request, s: ServerRequest, index: _ThreadIndex) -> RequestGpu | None:
    """r's GPU work within its prefill and decode steps (s: r.server)."""
    engine_tids = sorted({st.tid for st in s.steps}) or ([s.tid] if s.tid is not None else [])
    windows: list[tuple[int, int, list[int]]] = []
    if s.t_prefill_start_ns is not None and s.t_prefill_end_ns is not None:
        windows.append((s.t_prefill_start_ns, s.t_prefill_end_ns, engine_tids))
    windows += [(st.t_start_ns, st.t_end_ns, [st.tid]) for st in s.steps if st.t_end_ns is not None]
    if not windows:
        return None
    launches = graphs = 0
    waits: list[WaitInterval] = []
    for t0, t1, tids in windows:
        for tid in tids:
            waits += index.waits_in((s.pid, tid), t0, t1)
            runs = index.runs_in((s.pid, tid), t0, t1)
            launches += sum(x.kernels + x.graphs for x in runs)
            graphs += sum(x.graphs for x in runs)
    dispatch = next((t for t in (s.t_scheduled_ns, s.t_prefill_start_ns, s.t_start_ns) if t is not None),
                    r.t_ingress_ns)
    first = index.first_run_after([(s.pid, tid) for tid in engine_tids], dispatch)
    return _request_gpu(i, r, "decode_steps", sum(w.end_ns - w.start_ns for w in waits), launches, graphs,
                        first, waits)


def _request_gpu(i: int, r: Request, how: str, wait: int, launches: int, graphs: int,
                 first: GpuLaunchesRecord | None, waits: Sequence[WaitInterval] = ()) -> RequestGpu:
    t_first = first.ts_ns if first is not None else None
    if t_first is not None and r.t_end_ns is not None and t_first > r.t_end_ns:
        t_first = None
    to_token = (r.t_first_token_ns - t_first if t_first is not None and r.t_first_token_ns is not None
                and r.t_first_token_ns >= t_first else None)
    return RequestGpu(index=i, attributed_by=how, gpu_wait_ns=wait, gpu_launches=launches,
                      gpu_graph_launches=graphs, t_first_launch_ns=t_first,
                      launch_to_first_token_ns=to_token, wait_intervals=tuple(sorted(waits)))


def _thread_requests(requests: list[Request], index: _ThreadIndex, end_ns: int) -> list[RequestGpu]:
    """Socket-only attribution: a thread's GPU calls while exactly one request was in flight on it."""
    spans: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for i, r in enumerate(requests):
        if r.server is not None and r.server.steps:
            continue
        for tid in {r.tid, *r.write_tids}:
            spans[(r.pid, tid)].append((r.t_ingress_ns, r.t_end_ns or end_ns, i))
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    waits: dict[int, list[WaitInterval]] = defaultdict(list)
    first: dict[int, GpuLaunchesRecord] = {}

    def sole(key, t: int) -> int | None:
        owners = [i for t0, t1, i in spans[key] if t0 <= t <= t1]
        return owners[0] if len(set(owners)) == 1 else None

    for key in spans:
        for c in index.waits.get(key, []):
            owner = sole(key, c.ts_ns)
            if owner is not None:
                totals[owner][0] += c.duration_ns
                waits[owner].append(WaitInterval(c.ts_ns, c.exit_ns, "gpu", gpu_catalog.name(c.function)))
        for run in index.runs.get(key, []):
            owner = sole(key, run.ts_ns)
            if owner is not None:
                totals[owner][1] += run.kernels + run.graphs
                totals[owner][2] += run.graphs
                if owner not in first or run.ts_ns < first[owner].ts_ns:
                    first[owner] = run
    out = []
    for i in sorted(totals):
        wait, launches, graphs = totals[i]
        out.append(_request_gpu(i, requests[i], "thread", wait, launches, graphs, first.get(i), waits[i]))
    return out


def request_gpu(requests: list[Request], index: _ThreadIndex, end_ns: int) -> list[RequestGpu]:
    out = []
    for i, r in enumerate(requests):
        if r.server is not None and (r.server.steps or r.server.t_prefill_start_ns is not None):
            found = _usdt_request(i, r, r.server, index)
            if found is not None:
                out.append(found)
    out += _thread_requests(requests, index, end_ns)
    return sorted(out, key=lambda g: g.index)


# -- findings ------------------------------------------------------------------------


def _gpu_finding(kind: str, sentence: str, value: float) -> Finding:
    return Finding(kind=kind, sentence=sentence, source="gpu", value=value)


def findings(summary_steps: list[StepGpu], steps_from: str | None, functions: dict[str, FunctionSummary],
             processes: list[ProcessSummary], calls: list[GpuCallRecord]) -> list[Finding]:
    """sync_bound, launch_bound (value: the steps' wait share), alloc_churn, cuda_errors (value: a count)."""
    out = []
    what = "decode steps" if steps_from == "decode_steps" else "GPU cycles (launches up to the next wait)"
    steps = [s for s in summary_steps if s.duration_ns > 0]
    if len(steps) >= MIN_STEPS_FOR_FINDING:
        total = sum(s.duration_ns for s in steps)
        share = sum(s.wait_ns for s in steps) / total
        per_step = sum(s.launches for s in steps) / len(steps)
        graphs = sum(s.graph_launches for s in steps)
        waits: dict[str, int] = defaultdict(int)
        for c in calls:
            if is_wait(c.function):
                waits[gpu_catalog.name(c.function)] += c.duration_ns
        top = max(waits, key=waits.__getitem__) if waits else "GPU waits"
        if share >= SYNC_BOUND_SHARE:
            out.append(_gpu_finding(
                "sync_bound",
                f"{what} spend {share:.0%} of their time in {top}: the CPU side is waiting on the GPU, "
                "batching more requests per step would use that time", share))
        elif share < LAUNCH_BOUND_SHARE and per_step >= LAUNCH_BOUND_LAUNCHES and graphs == 0:
            out.append(_gpu_finding(
                "launch_bound",
                f"launch gaps dominate: {what} spend only {share:.0%} of their time waiting on the GPU "
                f"and make {per_step:.0f} kernel launches each: CPU-bound scheduling, consider CUDA graphs",
                share))
    churn = sum(p.allocations["during_requests"] for p in processes)
    if churn:
        out.append(_gpu_finding(
            "alloc_churn",
            f"{churn} GPU memory allocations while requests were in flight: allocating during serving "
            "adds latency; pre-allocate or use a caching allocator", churn))
    errors = {f.name: f.errors for f in functions.values() if f.errors}
    if errors:
        worst = max(errors, key=errors.__getitem__)
        out.append(_gpu_finding(
            "cuda_errors",
            f"{sum(errors.values())} CUDA calls returned an error ({worst}: {errors[worst]}); "
            "failed calls take the error path, so their timings say little about the GPU",
            sum(errors.values())))
    return out


# -- entry point ----------------------------------------------------------------------


def summarize_gpu(events: list[GpuRecord], snapshot: dict | None, requests: list[Request],
                  steps: list[DecodeStep], wall_ns: int | None, sources: str | None) -> GpuSummary | None:
    """None when the recording had no gpu probe set and holds no GPU events."""
    if snapshot is None and not events:
        return None
    snapshot = snapshot or {}
    calls = sorted((e for e in events if isinstance(e, GpuCallRecord)), key=lambda e: e.ts_ns)
    runs = _runs(events, snapshot)
    times = [c.exit_ns for c in calls] + [r.last_ns for r in runs]
    end_ns = max(times) if times else 0
    index = _ThreadIndex(calls, runs)
    functions = function_summaries(calls, snapshot)
    processes = process_summaries(calls, runs, requests, wall_ns, end_ns)
    step_list = usdt_steps(steps, index) if steps else []
    steps_from = "decode_steps" if step_list else None
    if not step_list:
        step_list = gpu_cycles(calls, runs)
        steps_from = "gpu_cycles" if step_list else None
    fences = [e.exit_ns - e.ts_ns for e in events if isinstance(e, GpuFenceRecord)]
    step_windows = [(s.pid, s.tid, s.t_start_ns, s.t_start_ns + s.duration_ns) for s in step_list]
    execution = summarize_execution(events, requests, step_windows)
    return GpuSummary(
        sources={
            "description": sources,
            "mode": snapshot.get("mode"),
            "run_max_launches": snapshot.get("run_max_launches"),
            "libraries": [{"pid": a["pid"], "path": a["path"], "library": a["library"],
                           "t_attached_ns": a["t_attached_ns"], "functions": len(a["symbols"]),
                           "failed": a["failed"]} for a in snapshot.get("attachments", [])],
            "drm_tracepoints": snapshot.get("drm_tracepoints", []),
            "drm_counts": snapshot.get("drm_counts", {}),
            "cupti_shim": snapshot.get("cupti_shim", {}),
        },
        functions=functions,
        processes=processes,
        requests=request_gpu(requests, index, end_ns),
        steps_from=steps_from,
        steps=step_list,
        fence_waits=Distribution.of(fences),
        findings=findings(step_list, steps_from, functions, processes, calls),
        execution=execution,
    )
