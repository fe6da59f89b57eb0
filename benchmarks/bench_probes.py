#!/usr/bin/env python3
"""Cost of one USDT probe call from Python, untraced and traced, side by side.

Measured in this one process, in interleaved rounds::

    N rounds of: [untraced: empty(), probe(), `usdt.enabled`]
                 [traced:   empty(), probe(), `usdt.enabled`]

where empty() is a Python function with the same number of arguments, and
"traced" means a minimal BPF program (a per-CPU counter) attached to the probe
through USDT, which increments its semaphore, as any tracer would. The BPF
program is compiled once; each traced phase enables the probes and attaches
the uprobes, and detaches them afterwards, so the untraced phases really run
with the semaphores at zero. Loop overhead (a `pass` statement timed the same
way) is subtracted; the medians over rounds are printed in ns and as ratios
against empty().

Usage (the traced half needs root, clang and libbpf's headers, as set-up
installs; without them only the untraced half runs, and says so)::

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

# The counter, built by clang and loaded with libbpf (tests/support/clang_bpf.py),
# on libbpf's USDT support: what any USDT consumer attaches, from outside.
BPF_COUNTER = r"""
#include <bpf/usdt.bpf.h>

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} calls SEC(".maps");

SEC("usdt") int count_call(struct pt_regs *ctx)
{
    u32 zero = 0;
    u64 *n = bpf_map_lookup_elem(&calls, &zero);
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
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository: tests.support
        from tests.support import clang_bpf

        self._dir = tempfile.TemporaryDirectory()
        self.bpf = clang_bpf.build(BPF_COUNTER, Path(self._dir.name), "counter")
        self.bpf.load()
        self.links: list = []

    def attach(self) -> None:
        from tests.programs.usdt_trace import probe_binary

        binary = probe_binary(os.getpid())
        for name in PROBES_MEASURED:
            # libbpf increments each probe's semaphore as it attaches
            self.links.append(self.bpf.attach_usdt("count_call", os.getpid(), binary, PROVIDER, name, 0))

    def detach(self) -> None:
        for link in self.links:
            link.destroy()   # and decrements the semaphore
        self.links.clear()

    def count(self) -> int:
        return sum(self.bpf["calls"][0])


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
        except Exception as e:  # no clang or libbpf: still report the untraced half
            why_untraced_only = f"the counter could not be built or loaded ({type(e).__name__}: {e})"

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
