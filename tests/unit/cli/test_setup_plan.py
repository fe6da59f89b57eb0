"""`make demo` runs the demo's set-up only (the plans themselves need root: tests/integration/cli)."""

from __future__ import annotations

import subprocess

from tests.support.paths import REPO


def test_make_demo_runs_the_demo_setup():
    out = subprocess.run(["make", "-n", "-C", str(REPO), "demo"], capture_output=True, text=True,
                         check=True).stdout
    assert "setup.sh --demo" in out
