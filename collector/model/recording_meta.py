"""What a recording says of itself: its metadata, read through one typed view.

The recorder writes a JSON object in the file's header when it starts
(collector/attach/session.recording_meta, then `record` and `agent` add what
they know: host_wide, engine_metrics, agent); an agent window adds `window`
when its segments are read as one (segment_ring.read_window). Recordings made
by older versions lack keys that newer ones have, or name them differently
(`bcc_version` before the move to libbpf). Every consumer reads it through
RecordingMeta, so the default for a missing key, and the old names, are
decided here once, not at each of the places that read it.

RecordingMeta is also a read-only Mapping of the JSON as written: the JSON
report carries it verbatim (as_json), and code that wants a key this view
does not name yet can still look it up. Nothing here writes metadata.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    """A process the recorder was pointed at (or adopted), as it listed them."""

    pid: int
    comm: str   # "unknown" where the recorder could not read the name


@dataclass(frozen=True)
class ServingAncestor:
    """The ancestor of the targets that serves where they may not
    (collector/processes/targets.serving_ancestor): the pid to record instead."""

    pid: int
    relation: str                    # "parent", "grandparent", "ancestor"
    shared: bool = False             # it holds the very listening sockets the targets inherited
    listens_too: bool = False        # it listens on TCP while the targets listen only locally
    its_listening: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServingAncestor:
        return cls(pid=int(data["pid"]), relation=str(data.get("relation", "ancestor")),
                   shared=bool(data.get("shared")), listens_too=bool(data.get("listens_too")),
                   its_listening=tuple(data.get("its_listening") or ()))


@dataclass(frozen=True)
class ProbeSets:
    """Which probe sets ran: name -> what it did (active) or why not (inactive)."""

    active: Mapping[str, str] = field(default_factory=dict)
    inactive: Mapping[str, str] = field(default_factory=dict)

    def present(self, name: str) -> bool:
        """The set was asked for, whether or not it could run."""
        return name in self.active or name in self.inactive


class RecordingMeta(Mapping[str, Any]):
    """A recording's metadata: typed fields with the defaults for older recordings,
    over the JSON object as written."""

    def __init__(self, raw: Mapping[str, Any] | None = None) -> None:
        self._raw: dict[str, Any] = dict(raw or {})

    @classmethod
    def of(cls, meta: Mapping[str, Any] | RecordingMeta | None) -> RecordingMeta:
        """meta as a RecordingMeta: live export hands over the dict the recorder is
        about to write, a report the one it read."""
        return meta if isinstance(meta, RecordingMeta) else cls(meta)

    # The Mapping of the JSON as written.
    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"RecordingMeta({self._raw!r})"

    def as_json(self) -> dict[str, Any]:
        """The metadata as written (a copy), for outputs that carry it verbatim."""
        return dict(self._raw)

    def with_fields(self, **changes: Any) -> RecordingMeta:
        """A copy with keys set (an agent window's `window`)."""
        return RecordingMeta({**self._raw, **changes})

    # Who, where, with what.
    @property
    def inferprobe_version(self) -> str | None:
        return self._raw.get("inferprobe_version")

    @property
    def layout_version(self) -> Any:
        """As written: collector/model/recording.check_layout judges it (None: before layouts were stated)."""
        return self._raw.get("layout_version")

    @property
    def host(self) -> str | None:
        return self._raw.get("host")

    @property
    def kernel(self) -> str | None:
        return self._raw.get("kernel")

    @property
    def loader(self) -> tuple[str, str | None]:
        """(what loaded the BPF programs, its version): libbpf since the move to
        programs built ahead of time, bcc before."""
        if "libbpf_version" in self._raw:
            return "libbpf", self._raw["libbpf_version"]
        return "bcc", self._raw.get("bcc_version")

    @property
    def command_line(self) -> list[str] | None:
        return self._raw.get("command_line")

    # The targets and what they serve.
    @property
    def targets(self) -> list[Target]:
        return [Target(int(t["pid"]), t.get("comm") or "unknown")
                for t in self._raw.get("targets", []) if "pid" in t]

    @property
    def target_names(self) -> dict[int, str]:
        """Each target's name (its comm) by pid."""
        return {t.pid: t.comm for t in self.targets}

    @property
    def listening(self) -> list[str]:
        """The targets' listening sockets at the start ("tcp 127.0.0.1:8000", "unix /run/x")."""
        return list(self._raw.get("listening") or [])

    @property
    def serving_ancestor(self) -> ServingAncestor | None:
        found = self._raw.get("listening_ancestor")
        return ServingAncestor.from_json(found) if found else None

    @property
    def probe_sets(self) -> ProbeSets:
        sets = self._raw.get("probe_sets")
        if isinstance(sets, list):   # recordings from before probe sets had reasons: names only
            return ProbeSets(active={name: "" for name in sets})
        if not isinstance(sets, Mapping):
            return ProbeSets()
        return ProbeSets(active=sets.get("active") or {}, inactive=sets.get("inactive") or {})

    # Clocks.
    @property
    def started_monotonic_ns(self) -> int | None:
        started = self._raw.get("started_monotonic_ns")
        return None if started is None else int(started)

    @property
    def realtime_offset_ns(self) -> int | None:
        """CLOCK_REALTIME - CLOCK_MONOTONIC when the recording started."""
        offset = self._raw.get("realtime_offset_ns")
        return None if offset is None else int(offset)

    @property
    def started_wall_ns(self) -> int | None:
        """When the recording started, on the wall clock."""
        if self.started_monotonic_ns is None or self.realtime_offset_ns is None:
            return None
        return self.started_monotonic_ns + self.realtime_offset_ns

    @property
    def startup_s(self) -> dict[str, float]:
        """The recorder's start-up by stage (prepare, verify, attach)."""
        return dict(self._raw.get("startup_s") or {})

    # What `record`, `agent` and an agent window add.
    @property
    def window(self) -> dict[str, Any] | None:
        """An agent window's segments (segment_ring.read_window): last_s, segments, run,
        complete, earlier_runs."""
        return self._raw.get("window")

    @property
    def earlier_runs(self) -> list[str]:
        """Agent runs that wrote within the window before the one read (a restart)."""
        return list((self.window or {}).get("earlier_runs") or [])
