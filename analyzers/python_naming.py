"""How each process's Python frames were named in a stack snapshot: walked
from its thread states, from a perf map, or not at all (and why), and the
share of its weight that has a Python frame. The report's stack sections
(reports/sections/stacks.py) and the JSON output (reports/json_stacks.py)
show it."""

from __future__ import annotations

from dataclasses import dataclass

PYTHON_STATUS = {
    "perf-map": "named (the interpreter writes a perf map)",
    "unresolved": "unnamed: Python frames show as the interpreter's C functions",
    None: "not a Python process",
}


@dataclass(frozen=True)
class PythonNaming:
    """How one process's Python frames were named in a stack snapshot (collector/attach/
    probe_sets/stacks.py keeps the facts, collector/binaries/python_stacks.py finds them)."""

    pid: int
    comm: str
    unit: str  # the snapshot's: samples (on-CPU) or us (off-CPU)
    python: str | None  # frames | perf-map | unresolved | None (not a Python process)
    version: str | None
    weight: int  # its samples (on-CPU) or µs off the CPU
    named: int  # of that weight, stacks with a Python frame (py::)
    not_walked: str | None  # why its frames were not walked at all
    walked_from_s: float | None  # walked only from this far into the recording
    unwalked_before: str | None  # and why not before then

    @property
    def share(self) -> float | None:
        return self.named / self.weight if self.weight else None

    @property
    def silent_zero(self) -> bool:
        """Walked, yet none of its samples has a Python frame: said in a note, never left at 0 % alone."""
        return self.python == "frames" and self.weight > 0 and self.named == 0

    @property
    def status(self) -> str:
        whose = "of its samples" if self.unit == "samples" else "of its time off the CPU"
        share = f": {self.share:.1%} {whose} with Python frames" if self.share is not None else ""
        if self.python == "frames":
            if self.walked_from_s is not None:
                return (f"named from {self.walked_from_s:.1f} s on (CPython {self.version}){share}; "
                        f"before then not walked: {self.unwalked_before}")
            return f"named: walked from its thread states (CPython {self.version}){share}"
        if self.not_walked:
            return f"not walked: {self.not_walked}{share}"
        return PYTHON_STATUS.get(self.python, str(self.python)) + (share if self.python else "")

    def as_dict(self) -> dict:
        return {"pid": self.pid, "comm": self.comm, "python": self.python, "python_version": self.version,
                "unit": self.unit, "weight": self.weight, "python_named_weight": self.named,
                "python_named_share": round(self.share, 4) if self.share is not None else None,
                "not_walked": self.not_walked, "walked_from_s": self.walked_from_s,
                "unwalked_before": self.unwalked_before, "status": self.status}


def python_naming(snap: dict) -> list[PythonNaming]:
    """Every process of a stack snapshot, with how its Python frames were named."""
    weight: dict[int, int] = {}
    named: dict[int, int] = {}
    for stack in snap.get("stacks", []):
        pid, w = int(stack["pid"]), int(stack["weight"])
        weight[pid] = weight.get(pid, 0) + w
        if any(f.startswith("py::") for f in stack.get("frames", [])):
            named[pid] = named.get(pid, 0) + w
    out = []
    for pid_text, proc in snap.get("processes", {}).items():
        pid = int(pid_text)
        out.append(PythonNaming(pid, proc.get("comm", "?"), snap.get("unit", "samples"), proc.get("python"),
                                proc.get("python_version"), weight.get(pid, 0), named.get(pid, 0),
                                proc.get("python_unsupported"), proc.get("python_walked_from_s"),
                                proc.get("python_unwalked_before")))
    return sorted(out, key=lambda p: p.pid)


def naming_notes(snap: dict) -> list[str]:
    """Notes the recording itself did not make: a walked process none of whose samples was named."""
    return [f"pid {p.pid} ({p.comm}): its Python thread states were walked, but none of its "
            f"{p.weight:,} {'samples' if p.unit == 'samples' else 'µs off the CPU'} has a Python frame "
            "(its threads ran no Python code, or the walk read nothing: docs/python-frames.md)"
            for p in python_naming(snap) if p.silent_zero]
