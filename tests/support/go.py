"""Building the tests' Go programs with the host's Go toolchain (Debian's golang-go)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def build_go_program(source: Path, out_dir: Path) -> Path:
    """Builds source into out_dir (its own GOCACHE there: no state outside the test); skips without Go."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed (Debian's golang-go; make setup installs it)")
    exe = out_dir / source.stem
    subprocess.run([go, "build", "-o", str(exe), str(source)], check=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(out_dir), "GOCACHE": str(out_dir / "gocache")})
    return exe
