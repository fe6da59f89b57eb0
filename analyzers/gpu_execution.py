"""GPU execution: what the GPU ran and when, from the CUPTI shim's records, per request and per step.

Input: the shim's decoded events (collector/model/events.py GpuApiRecord,
GpuActivityRecord, GpuClockRecord, GpuKernelNameRecord), request timelines and
decode-step windows. No I/O, no bcc.

Steps:
- clock: a record's GPU start and end are in CUPTI's clock; the shim's clock
  pairings (a CUPTI timestamp read between two CLOCK_MONOTONIC reads) give a
  line per process, fitted by least squares, that maps them onto the
  timeline of every other event;
- join: each activity record carries the correlation id of the API call that
  put it on the GPU; the shim's api probe fired at that call's entry, on the
  launching thread, so the join gives each GPU interval its CPU launch (tid,
  time). Records without a clock pairing cannot be placed and are counted,
  not guessed; records without their API call (launched before the shim
  started, or by a call the shim does not subscribe to) keep their GPU
  times but have no launch;
- windows: for a request (its prefill and decode steps where USDT says so,
  else its ingress to end) or a step, the executions its threads launched in
  it: GPU busy time (the union of their intervals, streams overlapping
  counted once), the idle gaps between them (the GPU waiting on the CPU:
  launch overhead, host syncs), and the launch -> first-token path;
- kernels: per kernel name, count and total GPU time, the MAX_KERNEL_ROWS
  largest by time kept and the rest summed in one row, so the table's size
  does not follow the number of distinct kernels (the shim itself names at
  most 4096).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from inferprobe.analyzers.intervals import merged, union_length
from inferprobe.collector.model.events import (
    GpuActivityKind,
    GpuActivityRecord,
    GpuApiRecord,
    GpuClockRecord,
    GpuKernelNameRecord,
    GpuShimStatus,
    GpuShimStatusRecord,
)
from inferprobe.collector.model.layout_generated import GPU_OTHER_KERNEL_NAME_ID
from inferprobe.collector.model.timeline import Request

MAX_KERNEL_ROWS = 30
OTHER_KERNELS = "(other kernels)"
# CUpti_ActivityMemcpyKind (cupti_activity.h): the copies' names.
CUPTI_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                    9: "HtoH", 10: "PtoP"}


# -- clock ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockMap:
    """CLOCK_MONOTONIC = mono0 + slope * (CUPTI clock - cupti0), for one process. Anchored at its first
    pairing so that the arithmetic stays in small numbers: CUPTI's clock reads like wall time (~1.8e18
    ns), where a float's step is 256 ns."""

    cupti0: int
    mono0: float
    slope: float
    pairs: int
    max_residual_ns: float  # the fit's worst miss over its pairs, plus half a pairing's read window

    def to_mono(self, cupti_ns: int) -> int:
        return round(self.mono0 + self.slope * (cupti_ns - self.cupti0))

    @staticmethod
    def fit(pairs: Sequence[GpuClockRecord]) -> ClockMap | None:
        """Least squares over (CUPTI time, midpoint of the two monotonic reads); one pair: slope 1."""
        if not pairs:
            return None
        cupti0 = pairs[0].cupti_ns
        xs = [float(p.cupti_ns - cupti0) for p in pairs]
        ys = [(p.mono_before_ns + p.mono_after_ns) / 2 for p in pairs]
        half_window = max((p.mono_after_ns - p.mono_before_ns) / 2 for p in pairs)
        n = len(pairs)
        mx, my = sum(xs) / n, sum(ys) / n
        var = sum((x - mx) ** 2 for x in xs)
        covariance = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        slope = covariance / var if n > 1 and var > 0 else 1.0
        mono0 = my - slope * mx
        residual = max(abs(y - (mono0 + slope * x)) for x, y in zip(xs, ys, strict=True))
        return ClockMap(cupti0=cupti0, mono0=mono0, slope=slope, pairs=n,
                        max_residual_ns=residual + half_window)


def clock_maps(clocks: Iterable[GpuClockRecord]) -> dict[int, ClockMap]:
    by_pid: dict[int, list[GpuClockRecord]] = defaultdict(list)
    for c in clocks:
        by_pid[c.pid].append(c)
    return {pid: m for pid, pairs in by_pid.items() if (m := ClockMap.fit(pairs)) is not None}


# -- join ----------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class GpuExecution:
    """One kernel, copy or memset on the monotonic timeline, with the CPU call that launched it."""

    start_ns: int
    end_ns: int
    pid: int
    kind: GpuActivityKind
    name: str  # the kernel's name, "memcpy DtoH", "memset"
    correlation_id: int
    stream: int
    device: int
    launch_tid: int | None  # None: its API call was not seen
    launch_ns: int | None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class JoinResult:
    executions: list[GpuExecution]  # sorted by start
    joined: int  # with their launch
    without_launch: int
    without_clock: int  # records of processes with no clock pairing: not placed
    clocks: dict[int, ClockMap]


def _name(record: GpuActivityRecord, names: dict[tuple[int, int], str]) -> str:
    if record.kind == GpuActivityKind.MEMCPY:
        return f"memcpy {CUPTI_COPY_KINDS.get(record.name_id, 'other')}"
    if record.kind == GpuActivityKind.MEMSET:
        return "memset"
    if record.name_id == GPU_OTHER_KERNEL_NAME_ID:
        return OTHER_KERNELS
    return names.get((record.pid, record.name_id), f"(kernel name {record.name_id} not seen)")


def join(activity: Iterable[GpuActivityRecord], apis: Iterable[GpuApiRecord],
         clocks: Iterable[GpuClockRecord], names: Iterable[GpuKernelNameRecord]) -> JoinResult:
    """GPU records joined to their launching API calls by (pid, correlation id), on CLOCK_MONOTONIC."""
    maps = clock_maps(clocks)
    name_of = {(n.pid, n.name_id): n.name for n in names}
    launch: dict[tuple[int, int], GpuApiRecord] = {}
    for a in apis:
        # The first call with an id wins: the runtime call, entered before the driver call inside it.
        key = (a.pid, a.correlation_id)
        if key not in launch or a.ts_ns < launch[key].ts_ns:
            launch[key] = a
    out: list[GpuExecution] = []
    joined = without_launch = without_clock = 0
    for r in activity:
        clock = maps.get(r.pid)
        if clock is None:
            without_clock += 1
            continue
        api = launch.get((r.pid, r.correlation_id))
        if api is None:
            without_launch += 1
        else:
            joined += 1
        out.append(GpuExecution(
            start_ns=clock.to_mono(r.gpu_start), end_ns=clock.to_mono(r.gpu_end), pid=r.pid, kind=r.kind,
            name=_name(r, name_of), correlation_id=r.correlation_id, stream=r.stream, device=r.device,
            launch_tid=api.tid if api else None, launch_ns=api.ts_ns if api else None))
    out.sort()
    return JoinResult(out, joined, without_launch, without_clock, maps)


# -- windows -------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowGpu:
    """The GPU work launched in one window (a request or a step)."""

    executions: int
    kernels: int
    busy_ns: int  # union of their GPU intervals
    span_ns: int  # first GPU start to last GPU end
    idle_ns: int  # span - busy: gaps in which the GPU waited for work
    largest_gap_ns: int
    kernel_ns: int  # sum of kernel durations (overlaps counted each time)
    busy: tuple[tuple[int, int], ...] = ()  # the merged busy intervals

    @property
    def idle_share(self) -> float | None:
        return self.idle_ns / self.span_ns if self.span_ns else None


def window_gpu(executions: Sequence[GpuExecution]) -> WindowGpu | None:
    if not executions:
        return None
    busy = merged((e.start_ns, e.end_ns) for e in executions)
    busy_ns = sum(b - a for a, b in busy)
    span = busy[-1][1] - busy[0][0]
    gaps = [busy[i + 1][0] - busy[i][1] for i in range(len(busy) - 1)]
    return WindowGpu(executions=len(executions),
                     kernels=sum(1 for e in executions if e.kind == GpuActivityKind.KERNEL),
                     busy_ns=busy_ns, span_ns=span, idle_ns=span - busy_ns,
                     largest_gap_ns=max(gaps, default=0),
                     kernel_ns=sum(e.duration_ns for e in executions if e.kind == GpuActivityKind.KERNEL),
                     busy=tuple(busy))


@dataclass(frozen=True)
class LaunchWindow:
    """Launches by thread tid of pid between t0 and t1 belong to the window."""

    pid: int
    tid: int | None  # None: any thread of pid
    t0: int
    t1: int


def launched_in(executions: Sequence[GpuExecution], windows: Sequence[LaunchWindow]) -> list[GpuExecution]:
    out = []
    for e in executions:
        if e.launch_ns is None:
            continue
        for w in windows:
            if e.pid == w.pid and (w.tid is None or e.launch_tid == w.tid) and w.t0 <= e.launch_ns <= w.t1:
                out.append(e)
                break
    return out


@dataclass(frozen=True)
class RequestGpuExecution:
    index: int  # position in ReportData.requests
    attributed_by: str  # "decode_steps" (USDT prefill and steps) or "request_window" (ingress to end)
    gpu: WindowGpu
    concurrent: int  # other requests whose windows overlap: a batched step's GPU time is theirs too
    t_first_launch_ns: int
    first_gpu_start_ns: int  # first GPU work of the request starts
    launch_queue_ns: int  # first launch -> its GPU start (queued behind earlier work, launch latency)
    gpu_before_first_token_ns: int | None  # busy time between the first launch and the first token
    last_gpu_end_to_first_token_ns: int | None  # the last GPU work before the first token ends -> token
    # on the wire (sampling, detokenising, the write)


def request_windows(r: Request) -> tuple[str, list[LaunchWindow]]:
    """Where r's GPU work is launched: its prefill and decode steps on their threads when the server's
    USDT probes say, else its whole window (ingress to end) in its process."""
    s = r.server
    if s is not None and (s.steps or s.t_prefill_start_ns is not None):
        engine_tids: list[int | None] = [*sorted({st.tid for st in s.steps})] or [s.tid]  # None: any thread
        windows = []
        if s.t_prefill_start_ns is not None and s.t_prefill_end_ns is not None:
            windows += [LaunchWindow(s.pid, tid, s.t_prefill_start_ns, s.t_prefill_end_ns)
                        for tid in engine_tids]
        windows += [LaunchWindow(s.pid, st.tid, st.t_start_ns, st.t_end_ns) for st in s.steps
                    if st.t_end_ns is not None]
        if windows:
            return "decode_steps", windows
    end = r.t_end_ns if r.t_end_ns is not None else r.t_ingress_ns
    return "request_window", [LaunchWindow(r.pid, None, r.t_ingress_ns, end)]


def request_execution(i: int, r: Request, executions: Sequence[GpuExecution],
                      others: Sequence[tuple[int, int]]) -> RequestGpuExecution | None:
    how, windows = request_windows(r)
    mine = launched_in(executions, windows)
    gpu = window_gpu(mine)
    if gpu is None:
        return None
    first = min(mine, key=lambda e: e.launch_ns or 0)
    t_first_launch = first.launch_ns if first.launch_ns is not None else first.start_ns
    first_start = min(e.start_ns for e in mine)
    before_token = last_gap = None
    token = r.t_first_token_ns
    if token is not None:
        done = [e for e in mine if e.end_ns <= token]
        clipped = merged((e.start_ns, min(e.end_ns, token)) for e in mine if e.start_ns < token)
        before_token = sum(b - a for a, b in clipped)
        last_gap = token - max(e.end_ns for e in done) if done else None
    lo = min(w.t0 for w in windows)
    hi = max(w.t1 for w in windows)
    concurrent = sum(1 for a, b in others if a < hi and b > lo)
    return RequestGpuExecution(
        index=i, attributed_by=how, gpu=gpu, concurrent=concurrent, t_first_launch_ns=t_first_launch,
        first_gpu_start_ns=first_start, launch_queue_ns=max(0, first.start_ns - t_first_launch),
        gpu_before_first_token_ns=before_token, last_gpu_end_to_first_token_ns=last_gap)


def per_request(requests: Sequence[Request], executions: Sequence[GpuExecution]) -> list[RequestGpuExecution]:
    spans = [(r.t_ingress_ns, r.t_end_ns if r.t_end_ns is not None else r.t_ingress_ns) for r in requests]
    out = []
    for i, r in enumerate(requests):
        others = spans[:i] + spans[i + 1:]
        found = request_execution(i, r, executions, others)
        if found is not None:
            out.append(found)
    return out


@dataclass(frozen=True)
class StepGpuExecution:
    pid: int
    tid: int
    t_start_ns: int
    t_end_ns: int
    gpu: WindowGpu | None  # None: the step launched nothing the shim saw

    @property
    def gpu_busy_share(self) -> float | None:
        """GPU busy time over the step's wall time: low means the GPU idled while the CPU stepped."""
        wall = self.t_end_ns - self.t_start_ns
        return (self.gpu.busy_ns / wall if self.gpu else 0.0) if wall > 0 else None


def per_step(steps: Iterable[tuple[int, int, int, int]],
             executions: Sequence[GpuExecution]) -> list[StepGpuExecution]:
    """steps: (pid, tid, t_start_ns, t_end_ns) of each decode step (USDT) or GPU cycle."""
    out = []
    for pid, tid, t0, t1 in steps:
        mine = launched_in(executions, [LaunchWindow(pid, tid, t0, t1)])
        out.append(StepGpuExecution(pid, tid, t0, t1, window_gpu(mine)))
    return out


# -- kernels -------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelRow:
    name: str
    kind: str  # "kernel", "memcpy", "memset"
    count: int
    total_ns: int
    max_ns: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


def kernel_table(executions: Iterable[GpuExecution], max_rows: int = MAX_KERNEL_ROWS) -> list[KernelRow]:
    """Per name, largest total first; rows past max_rows summed into one OTHER_KERNELS row."""
    acc: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for e in executions:
        row = acc[(e.name, e.kind.name.lower())]
        row[0] += 1
        row[1] += e.duration_ns
        row[2] = max(row[2], e.duration_ns)
    rows = sorted((KernelRow(name, kind, c, t, m) for (name, kind), (c, t, m) in acc.items()),
                  key=lambda r: (-r.total_ns, r.name))
    if len(rows) <= max_rows:
        return rows
    kept, rest = rows[:max_rows - 1], rows[max_rows - 1:]
    other = KernelRow(OTHER_KERNELS, "mixed", sum(r.count for r in rest), sum(r.total_ns for r in rest),
                      max(r.max_ns for r in rest))
    return [*kept, other]


# -- summary -------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuExecutionSummary:
    shim: dict[int, str]  # pid -> its last status sentence
    collecting: bool  # some process's shim reported collecting
    records: int
    joined: int
    without_launch: int
    without_clock: int
    clock_pairs: dict[int, int]  # pid -> pairings used
    clock_max_residual_ns: dict[int, float]
    busy_ns: int  # GPU busy time over the recording (union per process, summed)
    kernels: list[KernelRow]
    requests: list[RequestGpuExecution]
    steps: list[StepGpuExecution] = field(default_factory=list)

    def of_request(self, index: int) -> RequestGpuExecution | None:
        return next((r for r in self.requests if r.index == index), None)


def summarize_execution(events: Iterable[object], requests: Sequence[Request],
                        steps: Iterable[tuple[int, int, int, int]]) -> GpuExecutionSummary | None:
    """None when the recording holds nothing from the CUPTI shim."""
    activity: list[GpuActivityRecord] = []
    apis: list[GpuApiRecord] = []
    clocks: list[GpuClockRecord] = []
    names: list[GpuKernelNameRecord] = []
    status: dict[int, GpuShimStatusRecord] = {}
    for e in events:
        if isinstance(e, GpuActivityRecord):
            activity.append(e)
        elif isinstance(e, GpuApiRecord):
            apis.append(e)
        elif isinstance(e, GpuClockRecord):
            clocks.append(e)
        elif isinstance(e, GpuKernelNameRecord):
            names.append(e)
        elif isinstance(e, GpuShimStatusRecord):
            if e.pid not in status or e.ts_ns >= status[e.pid].ts_ns:
                status[e.pid] = e
    if not (activity or apis or clocks or status):
        return None
    result = join(activity, apis, clocks, names)
    by_pid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for x in result.executions:
        by_pid[x.pid].append((x.start_ns, x.end_ns))
    busy = sum(union_length(ivs) for ivs in by_pid.values())
    return GpuExecutionSummary(
        shim={pid: s.text for pid, s in sorted(status.items())},
        collecting=any(s.status == GpuShimStatus.COLLECTING for s in status.values()) or bool(activity),
        records=len(activity), joined=result.joined, without_launch=result.without_launch,
        without_clock=result.without_clock,
        clock_pairs={pid: m.pairs for pid, m in result.clocks.items()},
        clock_max_residual_ns={pid: m.max_residual_ns for pid, m in result.clocks.items()},
        busy_ns=busy, kernels=kernel_table(result.executions),
        requests=per_request(requests, result.executions),
        steps=per_step(steps, result.executions))
