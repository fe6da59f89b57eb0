"""Interpreters besides the project's own."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess


def _runs(python: str | None) -> bool:
    return bool(python) and os.access(python, os.X_OK) and subprocess.run(
        [python, "-V"], capture_output=True).returncode == 0


# A CPython 3.12+ besides the project's 3.11, where the host has one (pyenv):
# its perf trampoline and its asyncio's vectored writes are tested with it.
PY312 = next((p for p in [shutil.which("python3.12"), shutil.which("python3.13"),
                          *sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3.1[2-9]"))]
              if _runs(p)), None)
