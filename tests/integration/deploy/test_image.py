"""The agent image builds from the repository (deploy/image/Dockerfile), where Docker can."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _docker_usable() -> str | None:
    """None when a Docker daemon answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker client on this host"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        said = info.stderr.strip().splitlines()[-1] if info.stderr.strip() else "docker info failed"
        return f"no Docker daemon answers here ({said})"
    return None


def test_the_image_builds_and_runs_the_agent_help():
    why = _docker_usable()
    if why is not None:
        pytest.skip(f"cannot build the image: {why}; it also needs registry access for debian:12-slim")
    tag = "inferprobe:test"
    subprocess.run(["docker", "build", "-f", str(ROOT / "deploy/image/Dockerfile"), "-t", tag, str(ROOT)],
                   check=True, timeout=1800)
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "inferprobe", tag, "agent", "--help"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert "--max-cpu" in out and "--keep" in out
