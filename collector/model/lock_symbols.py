"""The names `record` stored for the code addresses lock waits mention (the locks snapshot).

probe_sets/locks.py names every address once, at stop, while the targets
still run, so `report` can classify waits on any machine. collector/attach/live_symbols.py
has the same interface for a live view.
"""

from __future__ import annotations

from collections.abc import Sequence


class Symbols:
    """The names the recorder stored for every code address (locks snapshot)."""

    def __init__(self, snapshot: dict | None):
        snap = snapshot or {}
        self._by_pid: dict[str, dict[str, dict]] = snap.get("symbols", {})
        self._stacks: dict[str, list[int]] = snap.get("stacks", {})
        self._runtimes: dict[str, list[int]] = snap.get("cpython_runtime", {})
        self._python: dict[str, dict[str, list[str]]] = snap.get("python_stacks", {})

    def frame(self, pid: int, addr: int) -> dict | None:
        return self._by_pid.get(str(pid), {}).get(str(addr))

    def name(self, pid: int, addr: int) -> str:
        f = self.frame(pid, addr)
        return f["function"] if f else f"{addr:#x}"

    def gil_state(self, pid: int) -> tuple[int, int] | None:
        """[start, end) of the process's CPython _PyRuntime (collector/binaries/cpython_runtime.py)."""
        runtime = self._runtimes.get(str(pid))
        return (runtime[0], runtime[1]) if runtime else None

    def stack(self, stack_id: int) -> list[int]:
        return self._stacks.get(str(stack_id), [])

    def python_frames(self, pid: int, python_stack_id: int) -> list[str]:
        """The Python frames of a wait or wake, innermost first (collector/binaries/python_stacks.py)."""
        return self._python.get(str(pid), {}).get(str(python_stack_id), []) if python_stack_id > 0 else []

    def frames(self, pid: int, ip: int, scan: Sequence[int], stack_id: int,
               python_stack_id: int = 0) -> tuple[str, ...]:
        """ip, then scan hits that follow a call instruction, then the frame-pointer
        stack past the ip, then the Python frames (the callers of all of those);
        adjacent duplicates dropped."""
        names = [self.name(pid, ip)] if ip else []
        for addr in scan:
            f = self.frame(pid, addr)
            if f and f["after_call"]:
                names.append(f["function"])
        if stack_id >= 0:
            names += [self.name(pid, a) for a in self.stack(stack_id)[1:]]
        names += self.python_frames(pid, python_stack_id)
        out: list[str] = []
        for n in names:
            if not out or out[-1] != n:
                out.append(n)
        return tuple(out)
