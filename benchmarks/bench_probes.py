#!/usr/bin/env python3
"""Cost of one USDT probe call from Python, untraced and traced, side by side.

Measured in this one process, in interleaved rounds::

    N rounds of: [untraced: empty(), probe(), `usdt.enabled`]
                 [traced:   empty(), probe(), `usdt.enabled`]

where empty() is a Python function with the same number of arguments, and
"traced" means a minimal bcc program (a per-CPU counter) attached to the probe
through USDT, which increments its semaphore, as any tracer would. The BPF
program is compiled once; each traced phase enables the probes and attaches
the uprobes, and detaches them afterwards, so the untraced phases really run
with the semaphores at zero. Loop overhead (a `pass` statement timed the same
way) is subtracted; the medians over rounds are printed in ns and as ratios
against empty().

Usage (the traced half needs root and bcc; without them only the untraced
half runs, and says so)::

    sudo .venv/bin/python benchmarks/bench_probes.py [--rounds 7] [--calls 1000000]
        [--traced-calls 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import timeit
from pathlib import Path

from inferprobe.probes import PROVIDER, usdt

PROBES_MEASURED = ("request_start", "token_emit")
TARGET_UNTRACED_NS = 150

BPF_COUNTER = b"""
#include <uapi/linux/ptrace.h>
BPF_PERCPU_ARRAY(calls, u64, 1);
int count(struct pt_regs *ctx) {
    u32 zero = 0;
    u64 *n = calls.lookup(&zero);
    if (n)
        (*n)++;
    return 0;
}
"""


def empty3(a, b, c):
    pass


def empty2(a, b):
    pass


CASES = {
    # name: (statement, baseline case)
    "empty(3 args)": ("f3(1, 2, 3)", None),
    "request_start": ("usdt.request_start(1, 2, 3)", "empty(3 args)"),
    "empty(2 args)": ("f2(1, 2)", None),
    "token_emit": ("usdt.token_emit(1, 2)", "empty(2 args)"),
    "if usdt.enabled": ("usdt.enabled", "empty(2 args)"),
}
NAMESPACE = {"usdt": usdt, "f3": empty3, "f2": empty2}


def per_call_ns(stmt: str, calls: int) -> float:
    """ns per execution of stmt, less the same loop around `pass`."""
    loop = timeit.Timer("pass", globals=NAMESPACE).timeit(calls)
    total = timeit.Timer(stmt, globals=NAMESPACE).timeit(calls)
    return (total - loop) / calls * 1e9


class Attacher:
    """Enables the measured probes on this very process and attaches a counter to each."""

    def __init__(self) -> None:
        from bcc import BPF

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository: tests.support
        from tests.support import bcc_uprobes

        # bcc's own attach passes a garbage ref_ctr_offset (tests/support/bcc_uprobes.py); bcc, not
        # inferprobe's loader, because this measures the probe sites themselves, from outside
        bcc_uprobes.install()
        self.bpf = BPF(text=BPF_COUNTER)
        # Load the program before the first USDT context exists: bcc 0.26
        # closes one fd of that context twice (once at creation, again when the
        # context is freed), and a program fd that reused the number would be
        # closed under us, failing the next attach with EINVAL.
        self.bpf.load_func(b"count", BPF.KPROBE)
        self.usdt = None
        self.attached: list[tuple[bytes, int]] = []

    def attach(self) -> None:
        from bcc import USDT

        self.usdt = USDT(pid=os.getpid())
        for name in PROBES_MEASURED:
            self.usdt.enable_probe(probe=f"{PROVIDER}:{name}", fn_name="count")
        for path, fn, addr, pid in self.usdt.enumerate_active_probes():
            self.bpf.attach_uprobe(name=path, fn_name=fn, addr=addr, pid=pid)
            self.attached.append((path, addr))

    def detach(self) -> None:
        import gc

        for path, addr in self.attached:
            self.bpf.detach_uprobe(name=path, addr=addr, pid=os.getpid())
        self.attached.clear()
        self.usdt = None  # closing the USDT context decrements the semaphores
        gc.collect()

    def count(self) -> int:
        return sum(self.bpf[b"calls"][0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1_000_000, help="calls per untraced measurement")
    ap.add_argument("--traced-calls", type=int, default=100_000, help="calls per traced measurement")
    args = ap.parse_args(argv)

    if not usdt.available:
        print(f"bench_probes: the C extension is not available: {usdt.reason}", file=sys.stderr)
        return 1
    attacher = None
    why_untraced_only = None
    if os.geteuid() != 0:
        why_untraced_only = "not root"
    else:
        try:
            attacher = Attacher()
        except Exception as e:  # bcc missing or no kernel headers: still report the untraced half
            why_untraced_only = f"bcc could not load the counter ({type(e).__name__}: {e})"

    results: dict[tuple[str, bool], list[float]] = {}
    fired_expected = fired = 0
    for _ in range(args.rounds):
        assert not usdt.enabled, "a tracer is attached to this process: untraced numbers would be wrong"
        for case, (stmt, _base) in CASES.items():
            results.setdefault((case, False), []).append(per_call_ns(stmt, args.calls))
        if attacher is None:
            continue
        attacher.attach()
        try:
            assert usdt.enabled
            for case, (stmt, _base) in CASES.items():
                results.setdefault((case, True), []).append(per_call_ns(stmt, args.traced_calls))
                if case in PROBES_MEASURED:
                    fired_expected += args.traced_calls
        finally:
            attacher.detach()
    if attacher is not None:
        fired = attacher.count()

    median = {key: statistics.median(v) for key, v in results.items()}
    print(f"USDT probe call cost, medians of {args.rounds} interleaved rounds, loop overhead subtracted")
    print(f"{'call':<18} {'untraced ns':>12} {'x empty()':>10} {'traced ns':>11} {'x empty()':>10}")
    for case, (_stmt, base) in CASES.items():
        row = f"{case:<18} {median[case, False]:>12.1f} "
        row += f"{median[case, False] / median[base, False]:>10.2f}" if base else f"{'1':>10}"
        if attacher is not None:
            row += f" {median[case, True]:>11.1f} "
            row += f"{median[case, True] / median[base, True]:>10.2f}" if base else f"{'1':>10}"
        print(row)
    worst = max(median[name, False] for name in PROBES_MEASURED)
    verdict = "ok" if worst < TARGET_UNTRACED_NS else "OVER TARGET"
    print(f"untraced probe call: {worst:.1f} ns (target < {TARGET_UNTRACED_NS} ns): {verdict}")
    if attacher is not None:
        # Proves the traced phases really went through the BPF program.
        print(f"traced calls counted by BPF: {fired} of {fired_expected}")
    else:
        print(f"traced half not run: {why_untraced_only}")
    return 0 if worst < TARGET_UNTRACED_NS else 2


if __name__ == "__main__":
    sys.exit(main())
