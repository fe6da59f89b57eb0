"""Findings: what an analyzer found, and the verdict at the top of a report.

A finding is one sentence with its number(s) and, where there is one, a
concrete recommendation. Every analyzer (decomposition, cadence, locks,
network, GPU, ...) makes its findings with this one type. The ones that can
say how much of a latency they explain carry a `share` and a pointer to the
report section that holds their evidence: those make the verdict, ranked by
that share. The others (a retransmission count, CUDA errors) are shown in
their analyzer's own section and in the JSON.

`share` is a fraction (0..1) of the latency named in `of` (e.g. "p99 TTFT",
"streaming time"): findings about different latencies are still ranked
together, because the question a reader asks first is "what explains the
most of the time I care about".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    kind: str  # stable identifier, e.g. "ttft.phase", "itl.stalls", "locks.mutex_wait", "nagle_coalescing"
    sentence: str  # one sentence, carrying its number(s)
    source: str  # the analyzer that made it
    recommendation: str = ""  # what to change
    # In the verdict (None: a finding that cannot say how much latency it explains):
    share: float | None = None  # 0..1 of the latency named in `of`
    of: str = ""  # which latency the share is of, e.g. "p99 TTFT"
    evidence: str = ""  # anchor id of the report section that shows the evidence
    # What it is about and the figures that crossed the analyzer's thresholds (the JSON shows them):
    conn_id: int | None = None  # the connection, for per-connection findings (network)
    value: float | None = None  # the one figure it rests on (GPU: a share or a count)
    figures: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.sentence:
            raise ValueError(f"finding {self.kind}: a sentence is required")
        if self.share is None:
            return
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"finding {self.kind}: share {self.share} is not in 0..1")
        if not self.recommendation or not self.evidence:
            raise ValueError(f"finding {self.kind}: a ranked finding needs a recommendation and evidence")

    def ranked_as(self, kind: str, share: float, of: str, evidence: str,
                  recommendation: str | None = None) -> Finding:
        """The same finding in the verdict: with the share of `of` it explains."""
        return dataclasses.replace(self, kind=kind, share=share, of=of, evidence=evidence,
                                   recommendation=self.recommendation if recommendation is None
                                   else recommendation)

    @property
    def percent(self) -> int:
        return round((self.share or 0.0) * 100)

    @property
    def headline(self) -> str:
        """The sentence, led by its share unless it already states it."""
        if self.sentence.startswith(f"{self.percent} %"):
            return self.sentence
        return f"{self.percent} % of {self.of}: {self.sentence}"


class FindingList:
    """Findings from every analyzer; ranked() is what the verdict shows."""

    def __init__(self, findings: Iterable[Finding] = ()) -> None:
        self._items: list[Finding] = []
        self.extend(findings)

    def add(self, finding: Finding) -> None:
        if finding.share is None:
            raise ValueError(f"finding {finding.kind}: only a finding with a share can be ranked")
        self._items.append(finding)

    def extend(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.add(f)

    def ranked(self) -> list[Finding]:
        # kind breaks ties so that the order is the same on every run
        return sorted(self._items, key=lambda f: (-(f.share or 0.0), f.kind, f.sentence))

    def __len__(self) -> int:
        return len(self._items)
