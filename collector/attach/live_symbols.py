"""Names for lock-wait code addresses while attached (`inferprobe top --locks`).

`record` names every address once, at stop, and stores the names in the
recording (probe_sets/locks.py); a live view cannot wait for the stop, so
this resolves each address the first time a wait mentions it, from the
target's own maps and ELF files, and reads frame-pointer stacks straight
from the kernel's stack map. Same interface as lock_symbols.Symbols (the
recorded names), so the classifier does not know which one it has.
"""

from __future__ import annotations

import time

from inferprobe.collector.attach.probe_sets.locks import read_stack
from inferprobe.collector.binaries import cpython_runtime
from inferprobe.collector.binaries.symbolizer import Symbolizer
from inferprobe.collector.model.lock_symbols import Symbols

MAPS_REREAD_S = 1.0


class LiveSymbols(Symbols):
    def __init__(self, stack_table) -> None:
        """stack_table: the locks set's lock_stacks map (LoadedTracer.table)."""
        super().__init__(None)
        self._stack_table = stack_table
        self._symbolizer = Symbolizer()
        self._frames: dict[tuple[int, int], dict] = {}
        self._maps_read: dict[int, float] = {}  # pid -> when its maps were last read
        self._stack_cache: dict[int, list[int]] = {}
        self._gil_states: dict[int, tuple[int, int] | None] = {}

    def frame(self, pid: int, addr: int) -> dict | None:
        key = (pid, addr)
        if key in self._frames:
            return self._frames[key]
        if pid not in self._maps_read:
            self._read_maps(pid)
        frame = self._symbolizer.code_frame(pid, addr)
        if frame.module == "?" and self._reread(pid):
            # Outside every mapping we knew: a library loaded since (torch
            # and CUDA load lazily). Read the maps again, at most once a second.
            frame = self._symbolizer.code_frame(pid, addr)
        if frame.module == "?":
            return frame.as_dict()  # not cached: a later read of the maps may know it
        self._frames[key] = frame.as_dict()
        return self._frames[key]

    def _read_maps(self, pid: int) -> None:
        # an exited process keeps what was read before: its waits keep their raw addresses
        self._symbolizer.remember_process(pid, read_files=False)
        self._maps_read[pid] = time.monotonic()

    def _reread(self, pid: int) -> bool:
        if time.monotonic() - self._maps_read.get(pid, 0.0) < MAPS_REREAD_S:
            return False
        self._read_maps(pid)
        return True

    def gil_state(self, pid: int) -> tuple[int, int] | None:
        if pid not in self._gil_states:  # _PyRuntime is a global: it never moves
            self._gil_states[pid] = cpython_runtime.runtime_range(pid)
        return self._gil_states[pid]

    def stack(self, stack_id: int) -> list[int]:
        if stack_id not in self._stack_cache:
            self._stack_cache[stack_id] = read_stack(self._stack_table, stack_id) or []
        return self._stack_cache[stack_id]
