"""inferprobe's commands run as subprocesses, and the shape of a failure they report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import inferprobe_cmd


def run_inferprobe(*args: str, **kw) -> subprocess.CompletedProcess:
    """`inferprobe ARGS...` as a subprocess, its output captured as text."""
    return subprocess.run(inferprobe_cmd(*args), capture_output=True, text=True, timeout=120, **kw)


def assert_one_sentence(result: subprocess.CompletedProcess, exit_code: int, *words: str) -> None:
    """A failure as inferprobe reports one: this exit code, no traceback, and one
    line on stderr that holds every one of words."""
    assert result.returncode == exit_code, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines[0]


def run_doctor(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`inferprobe doctor` in a wide terminal, with no BTF file (--btf) from our environment."""
    env = {k: v for k, v in os.environ.items() if k != "INFERPROBE_BTF"}
    env["COLUMNS"] = "200"
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "inferprobe.cli.main", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def json_report(recording: Path, *extra: str) -> dict:
    """`inferprobe report --format json` of a recording, parsed."""
    out = subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json", *extra),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)
