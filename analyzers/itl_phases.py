"""Inter-token latency by phase: where each gap between two token writes went.

A gap runs from one SSE token write on the socket (Request.token_ns[k-1])
to the next (token_ns[k]). With the server's USDT view it splits into
(docs/report-json.md, "itl_phases_ns"):

  flush   the token's token_emit -> its socket write. The token is the
          last token_emit at or before the write; clamped into the gap, so
          a token emitted before the previous write makes the whole gap flush.
  decode  before that emit: time inside the decode steps the request took
          part in (ServerRequest.steps, union of start..end).
  stall   before that emit, outside those steps, while waiting for one of
          them to start: batch stalls, other requests' prefills, the
          engine loop between steps.
  other   the rest before the emit: after the request's last step in the
          gap ended (sampling, hand-off to the API layer), or all of it when
          no step of the request ran in the gap.

The four sum to the gap exactly. Without USDT probes the socket says only
when tokens were written, so gaps cannot be split (None).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from inferprobe.analyzers.intervals import merged
from inferprobe.collector.model.timeline import Request

ITL_PHASES = ("decode", "stall", "flush", "other")


def split_gap(a: int, b: int, emits: Sequence[int],
              steps: Sequence[tuple[int, int | None]]) -> dict[str, int]:
    """One gap [a, b] split into ITL_PHASES; emits sorted, steps as (start, end or None)."""
    i = bisect.bisect_right(emits, b)
    e = min(max(emits[i - 1], a), b) if i else a
    inside = merged([(max(s, a), min(t if t is not None else e, e)) for s, t in steps
                      if s < e and (t is None or t > a)])
    inside = [(lo, hi) for lo, hi in inside if hi > lo]
    decode = sum(hi - lo for lo, hi in inside)
    # uncovered time before the start of the last step in the window is a wait for a step
    last_start = inside[-1][0] if inside else a
    covered_before = sum(hi - lo for lo, hi in inside[:-1])
    stall = max(0, last_start - a - covered_before)
    return {"decode": decode, "stall": stall, "flush": b - e, "other": e - a - decode - stall}


def gap_phases_ns(r: Request) -> list[dict[str, int]] | None:
    """Per gap between consecutive token writes, the split; None when it cannot be split."""
    s = r.server
    if s is None or not s.token_ns or not r.streaming:
        return None
    emits = sorted(s.token_ns)
    steps = [(st.t_start_ns, st.t_end_ns) for st in s.steps]
    return [split_gap(a, b, emits, steps) for a, b in zip(r.token_ns, r.token_ns[1:], strict=False)]


def itl_phases_ns(r: Request) -> dict[str, int] | None:
    """The request's gaps' splits summed: sums to token_ns[-1] - token_ns[0]."""
    gaps = gap_phases_ns(r)
    if gaps is None:
        return None
    return {p: sum(g[p] for g in gaps) for p in ITL_PHASES}


def gaps_at_percentiles(requests: Sequence[Request],
                        qs: Sequence[int]) -> dict[int, tuple[int, dict[str, int]]]:
    """q -> (gap ns, its split): the one real gap at each nearest-rank percentile of all split gaps.

    A real gap rather than an average of gaps near the rank: its phases sum
    exactly to the figure shown, and a tail gap is shown with what that gap
    was made of instead of being blended with gaps that had other causes.
    """
    gaps = []
    for r in requests:
        for split in gap_phases_ns(r) or ():
            gaps.append((sum(split.values()), r.conn, split))
    if not gaps:
        return {}
    gaps.sort(key=lambda g: (g[0], g[1]))
    out = {}
    for q in qs:
        gap, _conn, split = gaps[max(1, math.ceil(q / 100 * len(gaps))) - 1]
        out[q] = (gap, split)
    return out
