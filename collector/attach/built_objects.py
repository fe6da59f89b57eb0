"""Where the BPF objects built ahead of time are (scripts/build_bpf.sh)."""

from __future__ import annotations

from pathlib import Path

from inferprobe.collector.errors import EnvironmentProblem

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"


def built_object(name: str) -> Path:
    """A BPF object built ahead of time (scripts/build_bpf.sh), by file name.
    Installed: inferprobe/bpf/build next to inferprobe/collector. Source tree: ../bpf/build."""
    path = BPF_DIR / "build" / name
    if not path.is_file():
        raise EnvironmentProblem(f"the built BPF object {path} is missing: run 'make setup' "
                                 "(scripts/build_bpf.sh builds it with clang and libbpf's headers)")
    return path
