"""The CUPTI shim (probes/cupti/inferprobe_cupti.c): where it is built, whether a process maps it.

scripts/build_cupti_shim.sh builds it into CACHE/<cuda version>-<source hash>/;
this module finds that file without running the script (an installed
inferprobe has no scripts/), preferring the build of the source beside it.
"""

from __future__ import annotations

import hashlib
import os
from enum import IntEnum
from pathlib import Path

from inferprobe.collector.processes.proc_maps import read_maps

CACHE = Path(os.environ.get("CUPTI_CACHE", "/var/cache/inferprobe/cupti-shim"))
FILE_NAME = "libinferprobe_cupti.so"
SOURCE = Path(__file__).resolve().parents[2] / "probes" / "cupti" / "inferprobe_cupti.c"
PROVIDER = "inferprobe_gpu"
BUILD_HINT = "run scripts/build_cupti_shim.sh (sudo make setup does)"


class ShimStatus(IntEnum):
    """inferprobe_cupti_start()'s return value (enum shim_status in the shim, gpu_shim_status in
    bpf/inferprobe.h)."""

    NOT_STARTED = 0
    COLLECTING = 1
    NO_DEVICE = 2
    CUPTI_ERROR = 3
    STOPPED = 4


def _source_key() -> str | None:
    try:
        return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    except OSError:
        return None


def built_shim() -> Path | None:
    """The built shim: $INFERPROBE_CUPTI_SHIM, else the cache's build of this source, else the
    newest build in the cache; None when there is none."""
    override = os.environ.get("INFERPROBE_CUPTI_SHIM")
    if override:
        return Path(override) if Path(override).is_file() else None
    builds = [d for d in CACHE.glob("*") if (d / ".built").is_file() and (d / FILE_NAME).is_file()]
    if not builds:
        return None
    key = _source_key()
    matching = [d for d in builds if key and d.name.endswith("-" + key)]
    best = matching[0] if matching else max(builds, key=lambda d: d.stat().st_mtime)
    return best / FILE_NAME


def mapped_shim(pid: int) -> str | None:
    """The shim's path as pid maps it, or None."""
    for mapping in read_maps(pid):
        if os.path.basename(mapping.path) == FILE_NAME:
            return mapping.path
    return None
