"""Where things are: the repository, the test servers, the programs the tests build and run."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "tests" / "servers"
PROGRAMS = REPO / "tests" / "programs"
