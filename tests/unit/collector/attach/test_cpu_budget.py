"""The CPU budget's controller: lower the followed share above the budget, raise it well below."""

from __future__ import annotations

import pytest

from inferprobe.collector.attach.cpu_budget import MIN_RATIO, CpuBudget, bpf_run_time, parse_share


class Clocked(CpuBudget):
    """A budget whose cost readings come from a script: (wall, bpf, collector) ns."""

    def __init__(self, max_share, readings):
        super().__init__(max_share)
        self.readings = iter(readings)
        self._last = next(self.readings)

    def _now(self):
        return next(self.readings)


def _costing(share: float, steps: int) -> list[tuple[int, int, int]]:
    """Readings 1 s apart, each second costing share of a CPU (half BPF, half collector)."""
    return [(i * 10**9, int(i * share * 5e8), int(i * share * 5e8)) for i in range(steps + 1)]


def test_over_budget_the_ratio_drops_in_proportion():
    budget = Clocked(0.02, _costing(0.10, 1))
    sample = budget.sample()
    assert sample.share == pytest.approx(0.10)
    assert sample.bpf_share == pytest.approx(0.05)
    assert sample.ratio == pytest.approx(0.02 / 0.10 * 0.9)


def test_well_under_budget_the_ratio_climbs_back_to_one():
    budget = Clocked(0.02, _costing(0.001, 12))
    budget.ratio = 0.1
    ratios = [budget.sample().ratio for _ in range(12)]
    assert ratios == sorted(ratios) and ratios[-1] == 1.0


def test_at_the_floor_over_budget_is_flagged():
    budget = Clocked(0.02, _costing(0.5, 3))
    budget.ratio = MIN_RATIO
    assert budget.sample().over_at_floor
    assert budget.ratio == MIN_RATIO


def test_no_budget_follows_everything():
    budget = Clocked(None, _costing(0.9, 1))
    assert budget.sample().ratio == 1.0


def test_shares_parse():
    assert parse_share("2%") == pytest.approx(0.02) and parse_share("0.5") == 0.5
    for bad in ("x", "0%", "-1%", "%"):
        with pytest.raises(ValueError):
            parse_share(bad)


def test_bpf_run_time_reads_fdinfo(tmp_path):
    fdinfo = tmp_path / "42" / "fdinfo"
    fdinfo.mkdir(parents=True)
    (fdinfo / "3").write_text("pos:\t0\nprog_type:\t5\nprog_id:\t9\nrun_time_ns:\t1500\nrun_cnt:\t3\n")
    (fdinfo / "4").write_text("pos:\t0\nmap_type:\t2\nmap_id:\t7\n")   # a map: not counted
    (fdinfo / "5").write_text("prog_type:\t5\nprog_id:\t10\nrun_time_ns:\t500\nrun_cnt:\t1\n")
    assert bpf_run_time("42", proc=str(tmp_path)) == (2000, 4)
