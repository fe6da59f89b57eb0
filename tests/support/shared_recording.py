"""Several servers (or clients) of one test module recorded under one recorder.

A recording's compile and attach is most of a test case's time (docs/tests.md:
what a test recording costs), so a module whose cases can run one after the other
starts them all, records them together and gives each test its own process's
part of the report. A case that cannot start here (a missing stack) is skipped
alone, with its reason, and the others run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest

Started = TypeVar("Started")


def start_each(names: Iterable[str], start: Callable[[str], Started],
               into: dict[str, Started]) -> dict[str, str]:
    """start(name) for each name, each one put into `into` as it starts (so that the caller's
    finally stops those started before one that failed); returns name -> why it could not start."""
    skipped: dict[str, str] = {}
    for name in names:
        try:
            into[name] = start(name)
        except pytest.skip.Exception as why:
            skipped[name] = str(why)
        except FileNotFoundError as missing:   # a program the case runs is not installed
            skipped[name] = f"{name}: {missing}"
    return skipped


def case_of(recorded: dict, name: str) -> dict:
    """One case's view of a shared recording ({"cases": ..., "skipped": ...}); skips the case
    that could not start."""
    if name in recorded["skipped"]:
        pytest.skip(recorded["skipped"][name])
    return recorded["cases"][name]


def report_of_pid(report: dict, pid: int) -> dict:
    """The report of several processes as if pid alone had been recorded: its requests, its
    connections and its locks."""
    locks = report.get("locks")   # null without the locks set
    return {**report, "requests": [r for r in report["requests"] if r["pid"] == pid],
            "connections": [c for c in report["connections"] if c["pid"] == pid],
            "locks": None if locks is None else [lk for lk in locks if lk["pid"] == pid]}
