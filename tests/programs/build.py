"""Builds the small C programs the stack tests trace (with the host C compiler)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CC = shutil.which("cc") or shutil.which("gcc")
# Frame pointers in every function, leaves included, so the stacks are whole.
FLAGS = ["-O1", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fno-inline", "-pthread"]


def build(name: str, out_dir: Path) -> Path:
    if CC is None:
        pytest.skip("no C compiler on this host: cannot build the traced test program")
    exe = out_dir / name
    subprocess.run([CC, *FLAGS, "-o", str(exe), str(HERE / f"{name}.c")], check=True)
    return exe


class Program:
    """A test program started in the background; start() waits for its READY line."""

    def __init__(self, exe: Path, *args: str):
        self.proc = subprocess.Popen([str(exe), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.proc.kill()
            raise RuntimeError(f"{exe.name} did not start: {line!r}")
        self.pid = self.proc.pid

    def go(self) -> None:
        """Tells a program started with --hold to begin."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out
