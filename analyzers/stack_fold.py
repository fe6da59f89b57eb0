"""Folded stacks: `frame;frame;leaf weight` lines, root first.

The format flamegraph.pl, speedscope and inferno read. Here a profile is a
dict from a tuple of frames (root first) to its weight: samples for on-CPU
profiles, microseconds for off-CPU ones. Nothing in this module reads /proc or
ELF files: the recording already holds resolved frames (see
collector/attach/probe_sets/stacks.py and collector/binaries/symbolizer.py).
"""

from __future__ import annotations

from collections.abc import Iterable

Stacks = dict[tuple[str, ...], int]

GROUP_CHOICES = ("process", "thread", "none")


def clean_frame(name: str) -> str:
    """Frames may hold neither the separator nor a line break."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ") or "[empty]"


def root_frames(stack: dict, snapshot: dict, group: str) -> tuple[str, ...]:
    if group == "none":
        return ()
    proc = snapshot.get("processes", {}).get(str(stack["pid"]), {})
    frames: tuple[str, ...] = (clean_frame(f"{proc.get('comm', '?')} ({stack['pid']})"),)
    if group == "thread":
        frames += (clean_frame(f"{stack.get('thread') or 'thread'} ({stack['tid']})"),)
    return frames


def from_snapshot(snapshot: dict, group: str = "process") -> Stacks:
    """The kernel-aggregated profile of a stack snapshot, every stack kept."""
    out: Stacks = {}
    for stack in snapshot.get("stacks", []):
        key = root_frames(stack, snapshot, group) + tuple(clean_frame(f) for f in stack["frames"])
        out[key] = out.get(key, 0) + int(stack["weight"])
    return out


StackIds = tuple[int, int, int, int, int]


def frames_by_ids(snapshot: dict) -> dict[StackIds, dict]:
    """(pid, user id, kernel id, flags, Python stack id) -> the snapshot's stack entry, to resolve
    streamed samples (a recording made before Python stacks has no python_stack_id: 0)."""
    table: dict[StackIds, dict] = {}
    for stack in snapshot.get("stacks", []):
        key = (stack["pid"], stack["user_stack_id"], stack["kernel_stack_id"], stack["flags"],
               stack.get("python_stack_id", 0))
        table[key] = stack
    return table


def total(stacks: Stacks) -> int:
    return sum(stacks.values())


def to_text(stacks: Stacks) -> str:
    lines = [f"{';'.join(frames)} {weight}" for frames, weight in sorted(stacks.items()) if weight > 0]
    return "\n".join(lines) + ("\n" if lines else "")


def parse(text: str) -> Stacks:
    """Reads folded lines; a malformed line raises ValueError naming it."""
    out: Stacks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, _, weight = line.rstrip().rpartition(" ")
        try:
            value = int(weight)
        except ValueError:
            raise ValueError(f"line {number} does not end in a sample count: {line[:80]!r}") from None
        if not stack:
            raise ValueError(f"line {number} has a count but no frames")
        key = tuple(stack.split(";"))
        out[key] = out.get(key, 0) + value
    return out


def merge(profiles: Iterable[Stacks]) -> Stacks:
    out: Stacks = {}
    for stacks in profiles:
        for key, weight in stacks.items():
            out[key] = out.get(key, 0) + weight
    return out


def top_functions(stacks: Stacks, limit: int = 10, skip_roots: int = 0) -> list[tuple[str, int, int]]:
    """(frame, self weight, total weight) of the heaviest frames by self weight."""
    self_w: dict[str, int] = {}
    total_w: dict[str, int] = {}
    for frames, weight in stacks.items():
        body = frames[skip_roots:]
        if not body:
            continue
        self_w[body[-1]] = self_w.get(body[-1], 0) + weight
        for name in set(body):
            total_w[name] = total_w.get(name, 0) + weight
    ranked = sorted(self_w.items(), key=lambda kv: -kv[1])[:limit]
    return [(name, w, total_w[name]) for name, w in ranked]


def prune(stacks: Stacks, min_share: float) -> tuple[Stacks, int]:
    """The profile without frames narrower than min_share of the total, and
    how many frames that removed. A stack is cut above its first narrow frame
    and its weight kept on the frame below, so every width that stays, and the
    total, are unchanged (flamegraph.pl's --minwidth, done on the data so the
    SVG shrinks too)."""
    limit = min_share * total(stacks)
    prefix_w: dict[tuple[str, ...], int] = {}
    for frames, weight in stacks.items():
        for depth in range(1, len(frames) + 1):
            prefix_w[frames[:depth]] = prefix_w.get(frames[:depth], 0) + weight
    out: Stacks = {}
    for frames, weight in stacks.items():
        keep = len(frames)
        for depth in range(1, len(frames) + 1):
            if prefix_w[frames[:depth]] < limit:
                keep = depth - 1
                break
        key = frames[:keep] or ("[narrow frames]",)
        out[key] = out.get(key, 0) + weight
    dropped = sum(1 for w in prefix_w.values() if w < limit)
    return out, dropped
