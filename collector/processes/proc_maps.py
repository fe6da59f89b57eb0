"""A process's memory mappings, from /proc/PID/maps: what code and data it has where."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    offset: int  # of the mapping in its file
    path: str  # "" for anonymous memory; "[vdso]"-style names for the kernel's
    executable: bool

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/")

    @property
    def short_name(self) -> str:
        name = self.path.removesuffix(" (deleted)")
        return os.path.basename(name) if self.is_file else (name or "[anon]")


def parse_maps(text: str) -> list[Mapping]:
    """Every mapping of a /proc/PID/maps text, sorted by address."""
    maps = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        start, end = (int(v, 16) for v in parts[0].split("-"))
        path = parts[5].strip() if len(parts) > 5 else ""
        maps.append(Mapping(start, end, int(parts[2], 16), path, "x" in parts[1]))
    maps.sort(key=lambda m: m.start)
    return maps


def read_maps_text(pid: int) -> str | None:
    """/proc/PID/maps as it is: the one place it is read; None when pid is gone."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()
    except OSError:
        return None


def read_maps(pid: int) -> list[Mapping]:
    """pid's file-backed mappings; none when it is gone."""
    return [m for m in parse_maps(read_maps_text(pid) or "") if m.is_file]


def maps_file_named(pid: int, fragment: str) -> bool:
    """Whether pid maps a file whose path contains fragment ("libllama", "libpypy")."""
    return any(fragment in m.path for m in read_maps(pid))


def executable_ranges(pids: list[int]) -> list[tuple[int, int]]:
    """Merged executable file mappings of the targets (what a return address can point into)."""
    ranges = sorted((m.start, m.end) for pid in pids for m in read_maps(pid) if m.executable)
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


@dataclass(frozen=True, slots=True)
class MappedFile:
    """A file a process maps executable: a library or the executable, where uprobes go."""

    pid: int
    path: str  # as the process sees it (its mount namespace)
    file_key: tuple[int, int]  # (st_dev, st_ino): one file under many names

    @property
    def host_path(self) -> str:
        """A path to the same file from here, also for a process in a container."""
        return f"/proc/{self.pid}/root{self.path}"


def executable_files(pid: int) -> list[MappedFile]:
    """Every file pid maps executable, once each; none replaced on disk ("(deleted)":
    a uprobe would go to the new file), none gone; [] when pid is."""
    found: dict[tuple[int, int], MappedFile] = {}
    for mapping in read_maps(pid):
        if not mapping.executable or mapping.path.endswith(" (deleted)"):
            continue
        try:
            st = os.stat(f"/proc/{pid}/root{mapping.path}")
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        found.setdefault(key, MappedFile(pid, mapping.path, key))
    return list(found.values())
