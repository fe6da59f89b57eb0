"""Unions of time intervals, one implementation for every analyzer that needs them.

A lock wait, a decode step, a GPU kernel: each is (start_ns, end_ns), and they
overlap (two threads wait at once, kernels run on two streams). What a
request or a step spent in them is the length of their union, never the sum.
Intervals that touch are joined.
"""

from __future__ import annotations

from collections.abc import Iterable


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of intervals as disjoint, sorted ones."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    """The time covered by at least one of the intervals."""
    return sum(end - start for start, end in merged(intervals))
