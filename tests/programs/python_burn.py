"""A pure-Python CPU burner with a known split, for the Python frame walk's tests.

Runs burn_a, burn_b and burn_c in turn, each for about 1, 2 and 3 units of
work, and measures each call's CPU time with time.thread_time() itself. On
SIGTERM it prints `burn_a=SECONDS burn_b=... burn_c=...` and exits.

With `--sleeper`, it instead calls wait_in_sleep() in a loop, which sleeps
50 ms (off the CPU); on SIGTERM it prints `sleeps=N mean_sleep_us=US`.

With `--late-thread`, a second thread is started on SIGUSR1 that runs
burn_late the same way, after the tracer attached; it prints `late_tid=TID`
when it starts.

SIGUSR2 prints `rounds=N`: the burn_a/b/c rounds (or sleeps) done so far,
for a benchmark's work per wall second.

With `--hold`, it starts only once a line arrives on stdin: a test says "go"
after the tracer attached, so the burner does not take a core from the BPF
compile meanwhile.
"""

import os
import signal
import sys
import threading
import time

spent = {"burn_a": 0.0, "burn_b": 0.0, "burn_c": 0.0, "burn_late": 0.0}
UNIT = 20000


def _spin(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def burn_a():
    t = time.thread_time()
    s = 0
    for i in range(UNIT):
        s += i * i % 7
    spent["burn_a"] += time.thread_time() - t


def burn_b():
    t = time.thread_time()
    s = 0
    for i in range(2 * UNIT):
        s += i * i % 7
    spent["burn_b"] += time.thread_time() - t


def burn_c():
    t = time.thread_time()
    s = 0
    for i in range(3 * UNIT):
        s += i * i % 7
    spent["burn_c"] += time.thread_time() - t


def burn_late():
    print(f"late_tid={threading.get_native_id()}", flush=True)
    while True:
        t = time.thread_time()
        _spin(UNIT)
        spent["burn_late"] += time.thread_time() - t
        time.sleep(0)


sleeps = []
rounds = [0]


def wait_in_sleep():
    t = time.monotonic()
    time.sleep(0.05)
    sleeps.append(time.monotonic() - t)


def report(*_):
    print(" ".join(f"{k}={v:.6f}" for k, v in spent.items()), flush=True)
    if sleeps:
        print(f"sleeps={len(sleeps)} mean_sleep_us={1e6 * sum(sleeps) / len(sleeps):.1f}", flush=True)
    os._exit(0)


def progress(*_):
    print(f"rounds={rounds[0] + len(sleeps)}", flush=True)


def start_late(*_):
    threading.Thread(target=burn_late, name="late", daemon=True).start()


signal.signal(signal.SIGTERM, report)
signal.signal(signal.SIGUSR2, progress)
if "--late-thread" in sys.argv:
    signal.signal(signal.SIGUSR1, start_late)
print("READY", os.getpid(), flush=True)
if "--hold" in sys.argv:
    sys.stdin.readline()
while "--sleeper" in sys.argv:
    wait_in_sleep()
while True:
    burn_a()
    burn_b()
    burn_c()
    rounds[0] += 1
