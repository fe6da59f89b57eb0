"""Step-time models fitted on a recording's engine iterations.

The form is linear in what a step carries: a fixed cost per turn, a cost per
sequence decoded, per prompt token and per prompt processed, and per cached
position attended to. That is what a forward pass over a batch costs on a
CPU or a GPU that the batch does not saturate (weights read once a step,
work per token, attention over the cache), and it is what can be fitted
from a few hundred steps without over-fitting. A term the recording gives
no spread for (every step had the same batch) cannot be fitted and is left
out; so is one whose fitted cost comes out negative (two terms that moved
together, the fit trading one against the other): a step never gets cheaper
by carrying more. What is left is fitted by least squares.

A batch size is not only a number in a formula: the kernels an engine runs
change with it (the demo server's CPU matmuls change path at four sequences:
its steps of 3 and 4 took 61 and 88 ms, of 1 and 2 52 and 56). So the
fit is calibrated per batch size where the recording has steps of that size,
apart for steps that carried prompt tokens and steps that did not (a prompt
changes what dominates a step): each keeps the ratios of its steps'
measured to fitted times, their median sets its level and their spread is
what the replay draws from; a size with fewer than TAIL_STEPS steps, too few
to show its own tail, draws the spread of all the sizes of its kind, as time
added to its own level (see _with_tail). A size with too few steps takes the ratios of
all the sizes of its kind; past the largest size recorded, the largest
size's, and each sequence more costs what one more cost between the sizes
recorded (_marginal_ns), never more than the average extra sequence did from
the smallest size to the largest: that is an extrapolation, and every output says so.

Its error is measured, not assumed: five-fold cross-validation over the
recording's steps (each step predicted by a fit that did not see it).

Written here rather than taken from numpy or scikit-learn: the fit is a
normal-equation solve of at most five unknowns, and the report must run on
a laptop with only inferprobe's own dependencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from inferprobe.analyzers.cadence import percentile

FOLDS = 5
MIN_STEPS = 20  # fewer steps than this say nothing a fit could be trusted with
MIN_BATCH_SIZES = 3  # distinct decode batch sizes needed to fit the cost of one more sequence
RIDGE = 1e-9  # keeps the solve defined when two terms are exactly collinear
MIN_GROUP = 5  # steps of one batch size that calibrate that size on their own
TAIL_STEPS = 100  # steps of one batch size that show its own p99 (see _with_tail)


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + sum(coef * feature), y in nanoseconds."""

    what: str  # what y is, e.g. "decode turn"
    terms: tuple[str, ...]  # the features fitted, in order
    intercept_ns: float
    coef_ns: tuple[float, ...]
    dropped: tuple[str, ...]  # features left out, and why (see module docstring)
    samples: int
    cv_median_error: float  # median |predicted - measured| / measured over held-out steps
    cv_p90_error: float
    residual_ratios: tuple[float, ...]  # measured / fitted, per step (the replay draws from them)
    group: str | None = None  # the feature steps are calibrated by (the batch size)
    # (size, whether the step carried prompt tokens) -> its steps' measured / fitted, for the
    # groups with at least MIN_GROUP steps
    group_ratios: tuple[tuple[tuple[int, bool], tuple[float, ...]], ...] = ()
    # the same groups' median measured step times, ns (what _with_tail scales spreads by)
    group_times_ns: tuple[tuple[tuple[int, bool], float], ...] = ()
    # the cost of one more sequence past the largest size recorded (see _marginal_ns)
    marginal_ns: float | None = None

    def predict(self, features: dict[str, float]) -> float:
        """The linear part alone; past the largest size recorded, each sequence more at
        marginal_ns rather than at the fitted coefficient."""
        linear = self.intercept_ns + sum(c * features.get(t, 0.0) for t, c in zip(self.terms, self.coef_ns,
                                                                                 strict=True))
        if self._past_largest is None or self.group is None:
            return linear
        largest, extra_ns = self._past_largest
        beyond = features.get(self.group, 0.0) - largest
        return linear + extra_ns * beyond if beyond > 0 else linear

    @cached_property
    def _past_largest(self) -> tuple[int, float] | None:
        """The largest size recorded, and what a sequence past it costs beyond the fitted
        coefficient; worked out once, not at every step the replay times."""
        if self.marginal_ns is None or self.group is None or not self.group_ratios:
            return None
        return (max(size for (size, _), _ in self.group_ratios),
                self.marginal_ns - self.coefficient(self.group))

    def ratios_for(self, features: dict[str, float]) -> tuple[float, ...]:
        """The measured / fitted ratios of steps like this one: of its batch size and kind (with
        or without prompt tokens) where the recording has enough of them; past the largest
        size it has of that kind, that size's; otherwise those of every size of that kind."""
        if self.group is None or not self.group_ratios:
            return self.residual_ratios
        key = (int(features.get(self.group, 0.0)), _prefilling(features))
        # The replay asks for every step it times: each (size, kind) is worked out once.
        if (known := self._ratios_by_key.get(key)) is None:
            known = self._ratios_by_key[key] = self._ratios_of(key)
        return known

    @cached_property
    def _ratios_by_key(self) -> dict[tuple[int, bool], tuple[float, ...]]:
        return {}

    def _ratios_of(self, key: tuple[int, bool]) -> tuple[float, ...]:
        groups, times = dict(self.group_ratios), dict(self.group_times_ns)
        same_kind = [(size, r) for (size, kind), r in self.group_ratios if kind == key[1]]
        spreads = [(r, times.get((size, key[1]), 0.0)) for size, r in same_kind]
        if key in groups:
            return _with_tail(groups[key], times.get(key, 0.0), spreads)
        if same_kind and key[0] > max(size for size, _ in same_kind):
            largest = max(size for size, _ in same_kind)
            return _with_tail(groups[(largest, key[1])], times.get((largest, key[1]), 0.0), spreads)
        pooled = tuple(x for _, r in same_kind for x in r)
        return pooled or self.residual_ratios

    def typical(self, features: dict[str, float]) -> float:
        """The calibrated time: the linear part times the median ratio of steps like this one."""
        ratios = self.ratios_for(features)
        return self.predict(features) * (float(percentile(ratios, 50) or 1.0) if ratios else 1.0)

    def coefficient(self, term: str) -> float:
        return dict(zip(self.terms, self.coef_ns, strict=True)).get(term, 0.0)


class CannotFit(Exception):
    """The recording cannot support a fit; the message says why in one sentence."""


def _solve(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares through the normal equations (Gaussian elimination, partial pivoting)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) + (RIDGE if i == j else 0.0) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda k: abs(a[k][col]))
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        if a[col][col] == 0:
            continue
        for k in range(col + 1, n):
            f = a[k][col] / a[col][col]
            for j in range(col, n):
                a[k][j] -= f * a[col][j]
            b[k] -= f * b[col]
    x = [0.0] * n
    for i in reversed(range(n)):
        s = b[i] - sum(a[i][j] * x[j] for j in range(i + 1, n))
        x[i] = s / a[i][i] if a[i][i] else 0.0
    return x


def _scaled(samples: Sequence[dict[str, float]],
            terms: Sequence[str]) -> tuple[list[float], list[list[float]]]:
    """Each term divided by its largest value, so that a solve over nanoseconds per token and
    per thousand positions stays well conditioned."""
    scale = [max(abs(s.get(t, 0.0)) for s in samples) or 1.0 for t in terms]
    rows = [[1.0] + [s.get(t, 0.0) / k for t, k in zip(terms, scale, strict=True)] for s in samples]
    return scale, rows


def _fit_terms(samples: Sequence[dict[str, float]], ys: Sequence[float],
               terms: list[str]) -> tuple[list[str], float, list[float], list[str]]:
    """Fit; drop a term whose cost comes out negative and fit again, until none does."""
    dropped: list[str] = []
    while True:
        scale, rows = _scaled(samples, terms)
        x = _solve(rows, ys)
        coef = [c / k for c, k in zip(x[1:], scale, strict=True)]
        negative = [t for t, c in zip(terms, coef, strict=True) if c < 0]
        if not negative:
            return terms, x[0], coef, dropped
        worst = min(zip(terms, coef, strict=True), key=lambda tc: tc[1] * max(s.get(tc[0], 0.0)
                                                                               for s in samples))[0]
        terms = [t for t in terms if t != worst]
        dropped.append(f"{worst} (its fitted cost was negative)")


def _with_tail(own: tuple[float, ...], own_ns: float,
               kind: list[tuple[tuple[float, ...], float]]) -> tuple[float, ...]:
    """A size's ratios as the replay draws them. Its median is its level; its spread is its own
    only where it has the steps to show a tail (TAIL_STEPS). Fewer steps of one size are
    typically those of a quiet moment (the first client alone, before the others came), and a
    p99 drawn from them alone misses the slow steps that the host's other work causes at any
    size. There the spread is that of every size of its kind (`kind`: each size's ratios and
    median step time), as time: a step is slowed by what preempts it (the clients, the
    recorder, an interrupt on a host of few cores), which costs the same milliseconds to a
    short step and a long one, but comes to a short one as much less often. So each of their
    steps' time above or below its size's median is added to this size's median time (never
    below this size's fastest step), beside as many more of this size's median as the other
    size's steps are longer.

    llama.cpp on this repository's 2-core VM (tests/integration/engines/test_advise.py), p99
    ITL at -np 1 from recordings at -np 3: measured 14.47 and 16.4 ms in two runs; drawn as a
    ratio of the steps of 3 (1.15x at p99) 12.5 ms for the first; as their time added to every
    step, 15.5 and 20.3 ms; as here, 14.0 and 17.0 ms."""
    if len(own) >= TAIL_STEPS or own_ns <= 0:
        return own
    level = float(percentile(own, 50) or 1.0)
    floor = min(own)
    drawn: list[float] = []
    for r, size_ns in kind:
        mid = float(percentile(r, 50) or 0.0)
        if mid <= 0 or size_ns <= 0:
            continue
        # A step k times shorter is hit k times less often: each of their steps once, beside
        # k - 1 of this size's median.
        k = max(1, round(size_ns / own_ns))
        for x in r:
            drawn.append(max(floor, level * (1 + (x / mid - 1) * size_ns / own_ns)))
            drawn.extend([level] * (k - 1))
    return tuple(drawn)


def _prefilling(features: dict[str, float]) -> bool:
    return features.get("prefill_tokens", 0.0) > 0 or features.get("prefill_seqs", 0.0) > 0


GroupKey = tuple[int, bool]


def _groups(model: LinearFit, samples: Sequence[dict[str, float]], ys: Sequence[float], group: str | None
            ) -> tuple[tuple[tuple[GroupKey, tuple[float, ...]], ...], tuple[tuple[GroupKey, float], ...]]:
    """Per (size, kind) with at least MIN_GROUP steps: the steps' measured / fitted ratios, and
    their median measured time."""
    if group is None:
        return (), ()
    by: dict[GroupKey, list[tuple[float, float]]] = {}
    for s, y in zip(samples, ys, strict=True):
        if (p := model.predict(s)) > 0:
            by.setdefault((int(s.get(group, 0.0)), _prefilling(s)), []).append((y / p, y))
    kept = [(key, steps) for key, steps in sorted(by.items()) if len(steps) >= MIN_GROUP]
    return (tuple((key, tuple(r for r, _ in steps)) for key, steps in kept),
            tuple((key, float(percentile([y for _, y in steps], 50) or 0.0)) for key, steps in kept))


def _marginal_ns(model: LinearFit, samples: Sequence[dict[str, float]], ys: Sequence[float]) -> float | None:
    """The cost of one more sequence in a step, for sizes past those recorded: the median of
    the costs between each two sizes recorded next to each other (steps without a prompt,
    MIN_GROUP of each at least, net of the fit's other terms).

    A least-squares slope over the sizes recorded carries on whatever happened between them:
    the demo server's CPU matmuls take another path from four sequences on (its steps of 1, 2,
    3, 4: 52, 56, 61, 88 ms, a jump of 27 ms at 4), and the fitted 12 ms per sequence put its
    steps of 7 at 124 ms where they took 105-108 (CI and local runs, 2026-12-06; 5 ms a
    sequence on either side of the jump). A median of the steps between sizes is the cost the
    sizes share, and a jump is one of them. None where fewer than two such steps are seen.

    It is capped at the average extra cost of a sequence from the smallest size to the
    largest ((level at the largest - level at the smallest) / their difference in size): a
    batch amortizes what a step reads once (the weights) over more sequences, so one more
    costs less as the batch fills, not more. The demo's steps of 1, 2, 3, 4 also came out at
    54, 87, 110, 83 ms (2026-12-06: its path at 4 cheaper than at 2 or 3); the median of 33,
    23 and -27 ms put its steps of 7 at 150 ms where they took 108, and its p99 TTFT at 7
    places 24 % over the bound checked; capped (7.9 ms, net of the cached-position term),
    at 112 ms."""
    group = model.group
    if group is None:
        return None
    rest = {t: c for t, c in zip(model.terms, model.coef_ns, strict=True) if t != group}
    by: dict[int, list[float]] = {}
    for s, y in zip(samples, ys, strict=True):
        if not _prefilling(s):
            others = sum(c * s.get(t, 0.0) for t, c in rest.items())
            by.setdefault(int(s.get(group, 0.0)), []).append(y - others)
    level = {size: float(percentile(v, 50) or 0.0) for size, v in sorted(by.items()) if len(v) >= MIN_GROUP}
    sizes = sorted(level)
    slopes = [(level[b] - level[a]) / (b - a) for a, b in zip(sizes, sizes[1:], strict=False)]
    if len(slopes) < 2:
        return None
    average = (level[sizes[-1]] - level[sizes[0]]) / (sizes[-1] - sizes[0])
    return max(0.0, min(float(percentile(slopes, 50) or 0.0), average))


def _linear(what: str, samples: Sequence[dict[str, float]], ys: Sequence[float], terms: list[str],
            group: str | None) -> tuple[LinearFit, list[str]]:
    kept, intercept, coef, dropped = _fit_terms(samples, ys, terms)
    model = LinearFit(what, tuple(kept), intercept, tuple(coef), (), len(samples), 0.0, 0.0, (), group)
    ratios, times = _groups(model, samples, ys, group)
    return LinearFit(what, model.terms, intercept, model.coef_ns, (), len(samples), 0.0, 0.0,
                     tuple(y / p for s, y in zip(samples, ys, strict=True) if (p := model.predict(s)) > 0),
                     group, ratios, times, _marginal_ns(model, samples, ys)), dropped


def fit(what: str, samples: Sequence[dict[str, float]], ys: Sequence[float],
        terms: Sequence[str], group: str | None = None) -> LinearFit:
    if len(samples) < MIN_STEPS:
        raise CannotFit(f"the recording holds {len(samples)} {what} samples with the engine busy, and a fit "
                        f"needs at least {MIN_STEPS}")
    kept: list[str] = []
    dropped: list[str] = []
    for t in terms:
        if len({s.get(t, 0.0) for s in samples}) > 1:
            kept.append(t)
        else:
            dropped.append(f"{t} (the same in every step: nothing to fit it on)")
    model, negative = _linear(what, samples, ys, kept, group)
    errors: list[float] = []
    for fold in range(FOLDS):
        train = [i for i in range(len(samples)) if i % FOLDS != fold]
        test = [i for i in range(len(samples)) if i % FOLDS == fold]
        held, _ = _linear(what, [samples[i] for i in train], [ys[i] for i in train], list(model.terms), group)
        errors.extend(abs(held.typical(samples[i]) - ys[i]) / ys[i] for i in test if ys[i] > 0)
    return LinearFit(what, model.terms, model.intercept_ns, model.coef_ns, tuple(dropped + negative),
                     model.samples, float(percentile(errors, 50) or 0.0),
                     float(percentile(errors, 90) or 0.0),
                     model.residual_ratios, group, model.group_ratios, model.group_times_ns,
                     model.marginal_ns)
