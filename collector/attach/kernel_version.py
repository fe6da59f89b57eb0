"""The running kernel's version, read once from its release string: the oldest
the built objects load on, and what newer kernels add (bpf_loop, task storage)."""

from __future__ import annotations

import os
import re

from inferprobe.collector.errors import EnvironmentProblem

# The oldest kernel the built objects load on: the BPF ring buffer (5.8) carries every event.
OLDEST_KERNEL = (5, 8)


def kernel_at_least(minimum: tuple[int, int], release: str | None = None) -> bool:
    version = re.match(r"(\d+)\.(\d+)", release or os.uname().release)
    return version is not None and tuple(map(int, version.groups())) >= minimum


def ensure_kernel_version(release: str | None = None) -> None:
    release = release or os.uname().release
    if not kernel_at_least(OLDEST_KERNEL, release):
        raise EnvironmentProblem(
            f"Linux {release} is older than {OLDEST_KERNEL[0]}.{OLDEST_KERNEL[1]}, the first with the BPF "
            "ring buffer that every inferprobe program writes to: run it on a newer kernel")
