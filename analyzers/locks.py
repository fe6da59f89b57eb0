"""Lock contention per request: mutex.wait.ratio, the 0.37 flag, top contended locks.

Pure functions over Request timelines, decoded FUTEX_WAIT / OFFCPU records and
the locks snapshot (names of code addresses, made at record time); no I/O.
Definitions (docs/locks.md):

- serving threads of a request span: the thread that read the request
  (Request.tid) and every thread that wrote its response (Request.write_tids),
  in the request's process;
- span: ingress (the read of the request line returned) to the end of the
  response (Request.t_end_ns; for a request still open at the end of the
  recording, its last write);
- mutex.wait.ratio: the time inside the span during which at least one serving
  thread was blocked in a futex wait classified as lock acquisition (an
  application lock or the GIL), divided by the span's duration. Handoff waits
  (condition variables, semaphores, a semaphore the waiter took itself:
  waiting for work) do not count.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import cast

from inferprobe.analyzers.cadence import percentile
from inferprobe.analyzers.intervals import union_length
from inferprobe.collector.model.events import FutexWaitFlag, FutexWaitRecord, OffcpuReason, OffcpuRecord
from inferprobe.collector.model.lock_symbols import Symbols
from inferprobe.collector.model.timeline import DecodeStep, Request, WaitInterval
from inferprobe.collector.shared_constants import MUTEX_WAIT_THRESHOLD

DEFAULT_MUTEX_THRESHOLD = MUTEX_WAIT_THRESHOLD
FUTEX_LOCK_PI = 6
FUTEX_LOCK_PI2 = 13
FUTEX_WAIT = 0
GLIBC_LOCK_CONTENDED = 2  # glibc's lll lock word value "locked, with waiters"


class WaitKind(StrEnum):
    LOCK = "lock"  # acquiring an application lock (pthread mutex, rwlock, threading.Lock)
    GIL = "gil"  # acquiring the CPython GIL
    HANDOFF = "handoff"  # waiting for work: condition variable, semaphore, join
    UNKNOWN = "unknown"  # no known frame and nothing decisive in the futex arguments


# Functions that decide what a wait is, by name, innermost first wins; the
# sem/cond functions are wrappers whose caller can still make it a lock.
LOCK_FUNCTIONS = frozenset({
    "pthread_mutex_lock", "__pthread_mutex_lock", "pthread_mutex_timedlock",
    "__pthread_mutex_timedlock", "pthread_mutex_clocklock", "__pthread_mutex_clocklock",
    "__pthread_mutex_cond_lock", "__lll_lock_wait", "__lll_lock_wait_private", "mtx_lock",
    "mtx_timedlock", "pthread_rwlock_rdlock", "pthread_rwlock_wrlock",
    "pthread_rwlock_timedrdlock", "pthread_rwlock_timedwrlock", "pthread_rwlock_clockrdlock",
    "pthread_rwlock_clockwrlock", "pthread_spin_lock",
    # CPython: threading.Lock / RLock acquire (3.11: a semaphore; 3.13+: PyMutex)
    "PyThread_acquire_lock_timed", "PyThread_acquire_lock", "_PyMutex_LockTimed", "PyMutex_Lock",
    "_PyMutex_LockSlow",
})
GIL_FUNCTIONS = frozenset({
    "take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", "PyEval_AcquireLock",
    "PyGILState_Ensure", "_PyEval_ReInitThreads", "_PyThreadState_Attach",
})
HANDOFF_FUNCTIONS = frozenset({
    "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait", "cnd_wait",
    "cnd_timedwait", "sem_wait", "sem_timedwait", "sem_clockwait", "pthread_barrier_wait",
    "pthread_join", "pthread_timedjoin_np", "pthread_clockjoin_np", "__pthread_clockjoin_ex",
    "_PySemaphore_Wait", "PyEvent_Wait", "_PyEvent_WaitTimed",
})
CALLER_WINDOW = 3  # frames above a wrapper that may still make its wait a lock or GIL wait
# The known functions a futex wait on a semaphore passes through: where the
# innermost known frame is another primitive (a mutex, a condition variable),
# the futex word is no semaphore and a semaphore flag on it is stale.
SEMAPHORE_FUNCTIONS = frozenset({
    "sem_wait", "sem_timedwait", "sem_clockwait", "PyThread_acquire_lock_timed", "PyThread_acquire_lock",
})


@dataclass(frozen=True)
class ClassifiedWait:
    wait: FutexWaitRecord
    kind: WaitKind
    how: str  # "frames: <function>" or "futex: <reason>" (docs/locks.md)
    frames: tuple[str, ...]  # innermost first: ip, validated return addresses, fp stack
    waker_frames: tuple[str, ...]


def _lock_or_gil(name: str, gil_takers: frozenset[str]) -> tuple[WaitKind, str] | None:
    """(kind, note) when name is a lock-acquiring or GIL-taking function; the
    three sets are disjoint (learned takers are unnamed addresses)."""
    if name in GIL_FUNCTIONS:
        return WaitKind.GIL, ""
    if name in gil_takers:
        return WaitKind.GIL, " (take_gil: learned)"
    if name in LOCK_FUNCTIONS:
        return WaitKind.LOCK, ""
    return None


def _innermost_known(frames: Sequence[str], gil_takers: frozenset[str]) -> str | None:
    for name in frames:
        if name in HANDOFF_FUNCTIONS or _lock_or_gil(name, gil_takers) is not None:
            return name
    return None


def _semaphore_flags(frames: Sequence[str], wait: FutexWaitRecord,
                     gil_takers: frozenset[str]) -> FutexWaitFlag:
    """The wait's SEM_OWN / SEM_HELD flags, unless its frames show the futex is
    no semaphore (a semaphore freed while taken, its memory reused for a mutex
    or a condition variable: no sem_post or sem_init cleared its taker)."""
    flags = wait.flags & (FutexWaitFlag.SEM_OWN | FutexWaitFlag.SEM_HELD)
    if flags and _innermost_known(frames, gil_takers) not in (None, *SEMAPHORE_FUNCTIONS):
        return FutexWaitFlag(0)
    return flags


def classify(frames: Sequence[str], wait: FutexWaitRecord,
             gil_takers: frozenset[str] = frozenset(),
             gil_state: tuple[int, int] | None = None) -> tuple[WaitKind, str]:
    """What a wait was: the futex word's owner where it is known (the GIL's own
    state, a semaphore the waiter took itself), then the waiting code; the
    futex arguments only as a fallback.

    gil_takers: unnamed functions of this process known to wait for the GIL
    (learn_gil_takers); gil_state: where its CPython _PyRuntime lies."""
    # CPython keeps the GIL's mutex and condition variables in _PyRuntime and no
    # other futex word: a wait on one is a GIL wait whatever code waits, even
    # one too short to be scanned (collector/binaries/cpython_runtime.py).
    if gil_state is not None and gil_state[0] <= wait.uaddr < gil_state[1]:
        return WaitKind.GIL, "futex: the GIL's own mutex or condition (in CPython's _PyRuntime)"
    sem = _semaphore_flags(frames, wait, gil_takers)
    # Only another thread's sem_post can end this wait, so it waits for a signal,
    # not for a lock someone holds; CPython's Condition, Event and Queue waits
    # block this way, under the same frames as a contended threading.Lock.
    if FutexWaitFlag.SEM_OWN in sem:
        return WaitKind.HANDOFF, "semaphore: the waiter took it itself (a signal: Condition, Event, Queue)"
    for i, name in enumerate(frames):
        if (known := _lock_or_gil(name, gil_takers)) is not None:
            return known[0], f"frames: {name}{known[1]}"
        if name in HANDOFF_FUNCTIONS:
            for caller in frames[i + 1 : i + 1 + CALLER_WINDOW]:
                if (known := _lock_or_gil(caller, gil_takers)) is not None:
                    return known[0], f"frames: {caller} via {name}{known[1]}"
            return WaitKind.HANDOFF, f"frames: {name}"
    if FutexWaitFlag.SEM_HELD in sem:
        return WaitKind.LOCK, "semaphore: another thread took it (no known frame)"
    if wait.op in (FUTEX_LOCK_PI, FUTEX_LOCK_PI2):
        return WaitKind.LOCK, "futex: priority-inheritance lock op"
    if wait.op == FUTEX_WAIT and wait.val == GLIBC_LOCK_CONTENDED:
        return WaitKind.LOCK, "futex: glibc lock word value 2 (no known frame)"
    return WaitKind.UNKNOWN, "futex: no known frame"


def _unnamed(name: str) -> bool:
    return "+0x" in name  # Symbols names a function without a symbol "module+0xSTART"


def learn_gil_takers(stacks: Iterable[tuple[int, Sequence[str]]]) -> dict[int, frozenset[str]]:
    """Per pid, the unnamed functions that sit between a condition/semaphore wait and a GIL
    function in some stack: CPython's static take_gil, which Debian's stripped python3.11
    shows only as "python3.11+0x...". The eval loop also calls take_gil directly (after
    dropping the GIL on another thread's request: the main path of CPU-bound contention),
    with no named GIL function above it; knowing the function from the waits that came
    through PyEval_RestoreThread is what recognises those."""
    learned: dict[int, set[str]] = defaultdict(set)
    for pid, frames in stacks:
        for i, name in enumerate(frames):
            if name not in HANDOFF_FUNCTIONS:
                continue
            callers = frames[i + 1 : i + 1 + CALLER_WINDOW]
            for j, caller in enumerate(callers):
                if caller in GIL_FUNCTIONS:
                    learned[pid].update(c for c in callers[:j] if _unnamed(c))
                    break
            break
    return {pid: frozenset(names) for pid, names in learned.items()}


class WaitClassifier:
    """Classifies futex waits batch after batch, remembering the GIL takers it learned.

    A recording is one batch; `inferprobe top --locks` classifies each second's
    waits as they come, and a take_gil learned from one second's stacks
    classifies the next second's waits too."""

    def __init__(self, symbols: Symbols):
        self.symbols = symbols
        self.gil_takers: dict[int, frozenset[str]] = {}

    def classify(self, waits: Iterable[FutexWaitRecord]) -> list[ClassifiedWait]:
        sym = self.symbols
        stacks = []
        for w in waits:
            frames = sym.frames(w.pid, w.ip, w.scan, w.stack_id, w.python_stack_id)
            waker = sym.frames(w.pid, w.waker_ip, w.waker_scan, w.waker_stack_id,
                               w.waker_python_stack_id) if w.waker_ip else ()
            stacks.append((w, frames, waker))
        for pid, names in learn_gil_takers((w.pid, frames) for w, frames, _ in stacks).items():
            self.gil_takers[pid] = self.gil_takers.get(pid, frozenset()) | names
        out = []
        for w, frames, waker in stacks:
            kind, how = classify(frames, w, self.gil_takers.get(w.pid, frozenset()), sym.gil_state(w.pid))
            out.append(ClassifiedWait(w, kind, how, frames, waker))
        return out


def classify_all(waits: Iterable[FutexWaitRecord], symbols: Symbols) -> list[ClassifiedWait]:
    return WaitClassifier(symbols).classify(waits)


# ---------------------------------------------------------------- per span

def serving_threads(r: Request) -> set[int]:
    """The threads that serve a request span (docs/locks.md): the thread that
    read the request, every thread that wrote its response, and, when the
    server has USDT probes, the engine thread(s) that ran the decode steps
    it took part in."""
    engine = {step.tid for step in r.server.steps} if r.server is not None else set()
    return {r.tid, *r.write_tids, *engine}


def span_of(r: Request) -> tuple[int, int] | None:
    end = r.t_end_ns
    if end is None:
        writes = [t for t in (r.t_response_start_ns, *(r.token_ns[-1:])) if t is not None]
        end = max(writes) if writes else None
    if end is None or end <= r.t_ingress_ns:
        return None
    return r.t_ingress_ns, end


@dataclass(frozen=True)
class SpanLocks:
    span_ns: int
    lock_wait_ns: int  # union over serving threads: application locks and GIL
    gil_wait_ns: int
    handoff_wait_ns: int
    unknown_wait_ns: int
    runqueue_ns: int  # runnable, not running (summed over serving threads)
    offcpu_ns: dict[str, int]  # blocked time by reason, summed over serving threads
    top_lock: int | None  # futex address that cost this span most
    # each lock/GIL wait of those threads, clipped to the span (trace spans: exporters/spans.py)
    lock_waits: tuple[WaitInterval, ...] = ()

    @property
    def ratio(self) -> float:
        return self.lock_wait_ns / self.span_ns if self.span_ns else 0.0


class ThreadIndex:
    """Waits and off-CPU periods per (pid, tid), sorted by start."""

    def __init__(self, waits: Sequence[ClassifiedWait], offcpu: Sequence[OffcpuRecord]):
        self.waits: dict[tuple[int, int], list[ClassifiedWait]] = defaultdict(list)
        for cw in sorted(waits, key=lambda c: c.wait.ts_ns):
            self.waits[(cw.wait.pid, cw.wait.tid)].append(cw)
        self.offcpu: dict[tuple[int, int], list[OffcpuRecord]] = defaultdict(list)
        for o in sorted(offcpu, key=lambda o: o.ts_ns):
            self.offcpu[(o.pid, o.tid)].append(o)


def _clip(lo: int, hi: int, span: tuple[int, int]) -> tuple[int, int] | None:
    a, b = max(lo, span[0]), min(hi, span[1])
    return (a, b) if b > a else None


def span_locks(r: Request, index: ThreadIndex) -> SpanLocks | None:
    span = span_of(r)
    if span is None:
        return None
    return threads_span_locks(r.pid, serving_threads(r), span, index)


def threads_span_locks(pid: int, tids: set[int], span: tuple[int, int], index: ThreadIndex) -> SpanLocks:
    """Lock, handoff and off-CPU time of the given threads within span."""
    by_kind: dict[WaitKind, list[tuple[int, int]]] = defaultdict(list)
    per_addr: Counter[int] = Counter()
    lock_waits: list[WaitInterval] = []
    runq = 0
    offcpu: Counter[str] = Counter()
    for tid in tids:
        for cw in index.waits.get((pid, tid), ()):
            clipped = _clip(cw.wait.ts_ns, cw.wait.end_ns, span)
            if clipped:
                by_kind[cw.kind].append(clipped)
                if cw.kind in (WaitKind.LOCK, WaitKind.GIL):
                    per_addr[cw.wait.uaddr] += clipped[1] - clipped[0]
                    lock_waits.append(WaitInterval(*clipped, cw.kind.value, hex(cw.wait.uaddr)))
        for o in index.offcpu.get((pid, tid), ()):
            if o.reason != OffcpuReason.PREEMPTED:
                blocked = _clip(o.ts_ns, o.wake_ns, span)
                if blocked:
                    offcpu[o.reason.name.lower()] += blocked[1] - blocked[0]
            queued = _clip(o.wake_ns, o.wake_ns + o.runq_ns, span)
            if queued:
                runq += queued[1] - queued[0]
    locks = by_kind[WaitKind.LOCK] + by_kind[WaitKind.GIL]
    return SpanLocks(
        span_ns=span[1] - span[0],
        lock_wait_ns=union_length(locks),
        gil_wait_ns=union_length(by_kind[WaitKind.GIL]),
        handoff_wait_ns=union_length(by_kind[WaitKind.HANDOFF]),
        unknown_wait_ns=union_length(by_kind[WaitKind.UNKNOWN]),
        runqueue_ns=runq,
        offcpu_ns=dict(offcpu),
        top_lock=per_addr.most_common(1)[0][0] if per_addr else None,
        lock_waits=tuple(sorted(lock_waits)),
    )


def is_flagged(span: SpanLocks | None, threshold: float = DEFAULT_MUTEX_THRESHOLD) -> bool:
    return span is not None and span.ratio > threshold


# ---------------------------------------------------------------- per lock

@dataclass(frozen=True)
class ContendedLock:
    pid: int
    uaddr: int
    kind: WaitKind
    waits: int  # streamed waits (at least the floor)
    total_wait_ns: int
    p99_wait_ns: int
    max_wait_ns: int
    all_waits: int | None  # kernel totals, including waits below the floor
    all_wait_ns: int | None
    waiter_frames: tuple[str, ...]  # the most common waiting stack
    waker_frames: tuple[str, ...]  # the most common releasing stack
    how: str


GIL_KEY = -1  # top_locks' group of a process's GIL waits, whatever futex word each was on


def top_locks(waits: Sequence[ClassifiedWait], snapshot: dict | None, limit: int = 10) -> list[ContendedLock]:
    """The most waited-on locks. A process's GIL is one lock, though its waits fall on
    several futex words (CPython's GIL is a mutex and condition variables side by side:
    one GIL read as 3-4 "locks"); every other lock is its futex word."""
    groups: dict[tuple[int, int], list[ClassifiedWait]] = defaultdict(list)
    for cw in waits:
        groups[(cw.wait.pid, GIL_KEY if cw.kind == WaitKind.GIL else cw.wait.uaddr)].append(cw)
    totals = {(a["pid"], a["uaddr"]): a for a in (snapshot or {}).get("addresses", [])}
    out = []
    for (pid, key), group in groups.items():
        words = Counter(cw.wait.uaddr for cw in group)
        uaddr = key if key != GIL_KEY else words.most_common(1)[0][0]
        kinds = Counter(cw.kind for cw in group)
        kind = kinds.most_common(1)[0][0]
        if kind not in (WaitKind.LOCK, WaitKind.GIL):
            continue
        durations = [cw.wait.duration_ns for cw in group]
        waiter = Counter(cw.frames for cw in group).most_common(1)[0][0]
        wakers = Counter(cw.waker_frames for cw in group if cw.waker_frames)
        # the kernel's totals are per futex word: a GIL's are the sum over its words
        found = [totals[(pid, word)] for word in words if (pid, word) in totals]
        kernel = ({"waits": sum(k["waits"] for k in found), "wait_ns": sum(k["wait_ns"] for k in found)}
                  if found else None)
        how = Counter(cw.how for cw in group).most_common(1)[0][0]
        if len(words) > 1:
            how += f" ({len(words)} futex words: its mutex and condition variables)"
        out.append(ContendedLock(
            pid=pid, uaddr=uaddr, kind=kind, waits=len(group), total_wait_ns=sum(durations),
            p99_wait_ns=cast(int, percentile(durations, 99)),  # a group is never empty
            max_wait_ns=max(durations),
            all_waits=kernel["waits"] if kernel else None,
            all_wait_ns=kernel["wait_ns"] if kernel else None,
            waiter_frames=waiter,
            waker_frames=wakers.most_common(1)[0][0] if wakers else (),
            how=how,
        ))
    out.sort(key=lambda lk: -lk.total_wait_ns)
    return out[:limit]


# ---------------------------------------------------------------- everything

@dataclass
class LockAnalysis:
    enabled: bool  # the recording had the locks probe set on
    threshold: float
    spans: dict[int, SpanLocks | None] = field(default_factory=dict)  # id(request) -> span
    # Scheduler cycles (USDT decode steps): the engine thread during each step.
    steps: list[tuple[DecodeStep, SpanLocks]] = field(default_factory=list)
    locks: list[ContendedLock] = field(default_factory=list)
    waits_by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def of(self, r: Request) -> SpanLocks | None:
        return self.spans.get(id(r))

    def flagged(self, r: Request) -> bool:
        return is_flagged(self.of(r), self.threshold)

    def flagged_requests(self, requests: Sequence[Request]) -> list[Request]:
        return [r for r in requests if self.flagged(r)]


def analyze(
    requests: Sequence[Request],
    events: Iterable,
    snapshot: dict | None,
    threshold: float = DEFAULT_MUTEX_THRESHOLD,
    steps: Sequence[DecodeStep] = (),
) -> LockAnalysis:
    waits = [e for e in events if isinstance(e, FutexWaitRecord)]
    offcpu = [e for e in events if isinstance(e, OffcpuRecord)]
    enabled = snapshot is not None or bool(waits) or bool(offcpu)
    result = LockAnalysis(enabled=enabled, threshold=threshold)
    if not enabled:
        return result
    classified = classify_all(waits, Symbols(snapshot))
    index = ThreadIndex(classified, offcpu)
    result.spans = {id(r): span_locks(r, index) for r in requests}
    result.steps = [(st, threads_span_locks(st.pid, {st.tid}, (st.t_start_ns, st.t_end_ns), index))
                    for st in steps if st.t_end_ns is not None and st.t_end_ns > st.t_start_ns]
    result.locks = top_locks(classified, snapshot)
    kinds: dict[str, dict[str, int]] = {k.value: {"waits": 0, "wait_ns": 0} for k in WaitKind}
    for cw in classified:
        kinds[cw.kind.value]["waits"] += 1
        kinds[cw.kind.value]["wait_ns"] += cw.wait.duration_ns
    result.waits_by_kind = kinds
    result.counters = dict((snapshot or {}).get("counters", {}))
    result.settings = dict((snapshot or {}).get("settings", {}))
    return result
