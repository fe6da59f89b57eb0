"""analyzers/locks.py without BPF: classification by frames and span arithmetic."""

from __future__ import annotations

from inferprobe.analyzers import locks
from inferprobe.collector.model.events import EventType, FutexWaitFlag, FutexWaitRecord

NO_FLAGS = FutexWaitFlag(0)


def _wait(tid: int, start: int, duration: int, op: int = 0, val: int = 0,
          flags: FutexWaitFlag = NO_FLAGS, uaddr: int = 0x10) -> FutexWaitRecord:
    return FutexWaitRecord(
        type=EventType.FUTEX_WAIT, pid=1, tid=tid, ts_ns=start, duration_ns=duration, uaddr=uaddr,
        op=op, val=val, ret=0, flags=flags, ip=0, stack_id=-1, scan=(), waker_tid=0,
        waker_ip=0, waker_stack_id=-1, waker_scan=())


def test_classify_by_innermost_known_frame():
    w = _wait(1, 0, 1)
    assert locks.classify(["libc.so.6+0x86100", "pthread_mutex_lock", "f"], w)[0] == locks.WaitKind.LOCK
    assert locks.classify(["x", "pthread_cond_wait", "worker"], w)[0] == locks.WaitKind.HANDOFF
    # CPython 3.11: threading.Lock is a semaphore, the GIL a condition variable
    assert locks.classify(["x", "sem_clockwait", "PyThread_acquire_lock_timed"], w)[0] == locks.WaitKind.LOCK
    assert locks.classify(["x", "pthread_cond_timedwait", "python3.11+0x1f0", "PyEval_RestoreThread"],
                          w)[0] == locks.WaitKind.GIL


def test_gil_taker_learned_from_a_stack_through_a_gil_function():
    # Debian's stripped 3.11: take_gil is unnamed; PyEval_RestoreThread names it once,
    # then the eval loop's direct calls (no named GIL function above) are GIL waits too.
    through_restore = ("x", "pthread_cond_timedwait", "python3.11+0x4f92c0", "PyEval_RestoreThread")
    from_eval_loop = ("x", "pthread_cond_timedwait", "python3.11+0x4f92c0", "_PyEval_EvalFrameDefault")
    other_cond = ("x", "pthread_cond_timedwait", "python3.11+0x634310", "_PyEval_EvalFrameDefault")
    takers = locks.learn_gil_takers([(1, through_restore), (1, from_eval_loop), (1, other_cond)])
    assert takers == {1: frozenset({"python3.11+0x4f92c0"})}
    w = _wait(1, 0, 1)
    assert locks.classify(from_eval_loop, w, takers[1])[0] == locks.WaitKind.GIL
    assert locks.classify(other_cond, w, takers[1])[0] == locks.WaitKind.HANDOFF
    # without a stack through a GIL function nothing is learned: the same wait stays a handoff
    assert locks.learn_gil_takers([(1, from_eval_loop)]) == {}
    assert locks.classify(from_eval_loop, w)[0] == locks.WaitKind.HANDOFF


# CPython 3.11's Condition.wait: the waiter lock's second acquire blocks here
PY_LOCK_WAIT = ("libc.so.6+0x85e50", "sem_clockwait", "PyThread_acquire_lock_timed", "python3.11+0x5c1b20")


def test_semaphore_the_waiter_took_itself_is_a_handoff_even_under_lock_frames():
    own = _wait(1, 0, 1, flags=FutexWaitFlag.SEM_OWN | FutexWaitFlag.SCANNED)
    kind, how = locks.classify(PY_LOCK_WAIT, own)
    assert kind == locks.WaitKind.HANDOFF and how.startswith("semaphore:")
    # without a known frame, and for a wait that timed out (no waker), the same
    assert locks.classify(["?"], own)[0] == locks.WaitKind.HANDOFF
    # the flag missing (an older recording, a blocking take not seen): as before
    assert locks.classify(PY_LOCK_WAIT, _wait(1, 0, 1))[0] == locks.WaitKind.LOCK


def test_semaphore_another_thread_took_keeps_the_frames_answer():
    held = _wait(1, 0, 1, val=7, flags=FutexWaitFlag.SEM_HELD)
    kind, how = locks.classify(PY_LOCK_WAIT, held)
    assert (kind, how) == (locks.WaitKind.LOCK, "frames: PyThread_acquire_lock_timed via sem_clockwait")
    # a C program's sem_wait for work stays a handoff
    assert locks.classify(["x", "sem_wait", "worker"], held)[0] == locks.WaitKind.HANDOFF
    # no known frame (and a futex value that says nothing): held by another thread is a lock
    kind, how = locks.classify(["?"], held)
    assert kind == locks.WaitKind.LOCK and how.startswith("semaphore:")


def test_semaphore_flag_on_a_futex_the_frames_show_is_no_semaphore_is_ignored():
    # a taker left on an address freed without sem_destroy and reused by a mutex
    stale = _wait(1, 0, 1, flags=FutexWaitFlag.SEM_OWN)
    assert locks.classify(["x", "pthread_mutex_lock", "f"], stale)[0] == locks.WaitKind.LOCK


def test_a_futex_inside_cpython_runtime_is_the_gil():
    runtime = (0xA5B740, 0xA84260)
    mutex = _wait(1, 0, 1, val=2, uaddr=0xA5B8F8)  # 10 us: no stack scan, only the ip
    kind, how = locks.classify(["libc.so.6+0x86100"], mutex, gil_state=runtime)
    assert kind == locks.WaitKind.GIL and "_PyRuntime" in how
    assert locks.classify(["x", "pthread_mutex_lock", "f"], mutex, gil_state=runtime)[0] == locks.WaitKind.GIL
    assert locks.classify(["libc.so.6+0x86100"], mutex)[0] == locks.WaitKind.LOCK
    elsewhere = _wait(1, 0, 1, val=2, uaddr=0xA84260)
    assert locks.classify(["libc.so.6+0x86100"], elsewhere, gil_state=runtime)[0] == locks.WaitKind.LOCK
    # the recording's snapshot carries the range per pid
    snapshot = {"cpython_runtime": {"1": list(runtime)}}
    [cw] = locks.classify_all([mutex], locks.Symbols(snapshot))
    assert cw.kind == locks.WaitKind.GIL


def test_classify_falls_back_to_futex_arguments_and_says_so():
    kind, how = locks.classify(["?"], _wait(1, 0, 1, op=0, val=2))
    assert kind == locks.WaitKind.LOCK and how.startswith("futex:")
    assert locks.classify(["?"], _wait(1, 0, 1, op=0, val=7))[0] == locks.WaitKind.UNKNOWN


def test_span_lists_its_lock_waits_clipped_to_the_request():
    from inferprobe.collector.model.timeline import Outcome, Request

    r = Request(pid=1, tid=5, conn=1, method="GET", path="/", t_ingress_ns=100, outcome=Outcome.COMPLETE,
                t_end_ns=200)
    waits = [_wait(5, 50, 100, val=2),   # lock word "contended": a lock wait, 100..150 inside
             _wait(5, 160, 10, val=7),   # unknown: not a lock wait
             _wait(6, 120, 10, val=2)]   # another thread: not this request's
    span = locks.analyze([r], waits, None).of(r)
    assert span.lock_waits == ((100, 150, "lock", "0x10"),)
    assert span.lock_wait_ns == sum(w.end_ns - w.start_ns for w in span.lock_waits)


def test_one_gil_on_several_futex_words_is_one_lock():
    """CPython's GIL is a mutex and condition variables side by side: waits on any of its
    words are the one GIL; a lock's waits stay its own word's."""
    def cw(uaddr: int, kind: locks.WaitKind, duration: int) -> locks.ClassifiedWait:
        return locks.ClassifiedWait(_wait(1, 0, duration, uaddr=uaddr), kind, "frames: take_gil"
                                    if kind == locks.WaitKind.GIL else "frames: pthread_mutex_lock", (), ())

    gil = [cw(0x1000, locks.WaitKind.GIL, 5), cw(0x1008, locks.WaitKind.GIL, 7),
           cw(0x1030, locks.WaitKind.GIL, 9), cw(0x1008, locks.WaitKind.GIL, 1)]
    mutex = [cw(0x2000, locks.WaitKind.LOCK, 4), cw(0x2040, locks.WaitKind.LOCK, 3)]
    snapshot = {"addresses": [{"pid": 1, "uaddr": 0x1000, "waits": 10, "wait_ns": 50},
                              {"pid": 1, "uaddr": 0x1008, "waits": 4, "wait_ns": 20}]}
    top = locks.top_locks(gil + mutex, snapshot)
    assert [(lk.kind, lk.uaddr, lk.waits, lk.total_wait_ns) for lk in top] == [
        (locks.WaitKind.GIL, 0x1008, 4, 22), (locks.WaitKind.LOCK, 0x2000, 1, 4),
        (locks.WaitKind.LOCK, 0x2040, 1, 3)]
    assert (top[0].all_waits, top[0].all_wait_ns) == (14, 70)
    assert "3 futex words" in top[0].how and "futex words" not in top[1].how
