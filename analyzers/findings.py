"""Findings: the verdict at the top of a report.

A finding is one sentence with its number, a concrete recommendation, and a
pointer to the report section that holds its evidence. Every analyzer
(decomposition, cadence, locks, network, GPU, ...) appends the findings it
can back; the report ranks them by the share of latency each one explains.

`share` is a fraction (0..1) of the latency named in `of` (e.g. "p99 TTFT",
"streaming time"): findings about different latencies are still ranked
together, because the question a reader asks first is "what explains the
most of the time I care about".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    kind: str  # stable identifier, e.g. "ttft.phase", "itl.stalls", "locks.mutex_wait"
    share: float  # 0..1 of the latency named in `of`
    of: str  # which latency the share is of, e.g. "p99 TTFT"
    sentence: str  # one sentence, carrying its number(s)
    recommendation: str  # what to change
    evidence: str  # anchor id of the report section that shows the evidence
    source: str  # the analyzer that made it

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"finding {self.kind}: share {self.share} is not in 0..1")
        if not self.sentence or not self.recommendation or not self.evidence:
            raise ValueError(f"finding {self.kind}: sentence, recommendation and evidence are required")

    @property
    def percent(self) -> int:
        return round(self.share * 100)

    @property
    def headline(self) -> str:
        """The sentence, led by its share unless it already states it."""
        if self.sentence.startswith(f"{self.percent} %"):
            return self.sentence
        return f"{self.percent} % of {self.of}: {self.sentence}"


class FindingList:
    """Findings from every analyzer; ranked() is what the verdict shows."""

    def __init__(self, findings: Iterable[Finding] = ()) -> None:
        self._items: list[Finding] = list(findings)

    def add(self, finding: Finding) -> None:
        self._items.append(finding)

    def extend(self, findings: Iterable[Finding]) -> None:
        self._items.extend(findings)

    def ranked(self) -> list[Finding]:
        # kind breaks ties so that the order is the same on every run
        return sorted(self._items, key=lambda f: (-f.share, f.kind, f.sentence))

    def __len__(self) -> int:
        return len(self._items)


def ms(ns: float | None) -> str:
    """A latency for a sentence: three significant figures, in ms."""
    if ns is None:
        return "-"
    value = ns / 1e6
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"
