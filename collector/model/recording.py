"""Recording files (.ipr): the kernel's events as they arrived, framed.

Layout, all integers little-endian (documented in docs/recording-format.md):

    file header   8s magic "INFPRB\\r\\n" | u16 format_version | u16 reserved | u32 meta_len
    metadata      meta_len bytes of UTF-8 JSON (host, kernel, targets, clock offset, ...)
    records       u32 payload_len | u16 record_type | u16 reserved | u32 crc32(payload) | payload

Record types: EVENTS (u16 length + raw event bytes, repeated), RINGBUF
(events in the kernel ring buffer's own framing, as collector/attach/ringbuf.py
copied them out in bulk), STATS (JSON
counters taken while recording), END (JSON final counters; its absence
means the recorder did not stop cleanly), SNAPSHOT (JSON: one probe set's
kernel-side aggregates, e.g. stack tables, written before END), ENGINE_METRICS
(JSON: one scrape of the engine's own Prometheus endpoint, collector/attach/engine_scrape.py).

Events are stored raw, exactly as bpf/inferprobe.h lays them out, so that
`report` can be re-run with better analyzers on an old recording. They hold
no request or response body bytes: the kernel side never copies those out.

The writer flushes at least once a second, so a crash or kill -9 of the
recorder loses at most the last second; the reader stops at the first torn
or corrupt record and says where.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.model.events import LAYOUT_VERSION
from inferprobe.collector.model.recording_meta import RecordingMeta
from inferprobe.collector.model.ringbuf_format import iter_ring_records

MAGIC = b"INFPRB\r\n"
FORMAT_VERSION = 1
FILE_HEADER = struct.Struct("<8sHHI")
RECORD_HEADER = struct.Struct("<IHHI")
EVENT_LENGTH = struct.Struct("<H")

RECORD_EVENTS = 1
RECORD_STATS = 2
RECORD_END = 3
RECORD_SNAPSHOT = 4
RECORD_RINGBUF = 5
RECORD_ENGINE_METRICS = 6

NO_END_RECORD = "the recorder did not stop cleanly (no end record)"   # Recording.problem, all read
MAX_RECORD_BYTES = 1 << 30  # a larger length field means corruption (ring buffers are <= 512 MiB)


class RecordingWriter:
    """Appends events to a recording; call flush() at least once a second."""

    def __init__(self, path: str | os.PathLike, meta: dict, flush_bytes: int = 1 << 20):
        self.path = Path(path)
        try:
            self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        except OSError as err:
            raise RecordingProblem(f"cannot write the recording {self.path}: {err.strerror}") from None
        meta_bytes = json.dumps(meta, sort_keys=True).encode()
        # one write: a kill between header and metadata would leave a file no reader opens
        self._file.write(FILE_HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(meta_bytes)) + meta_bytes)
        self._file.flush()
        self._pending: list[bytes] = []
        self._pending_kind = RECORD_EVENTS
        self._pending_bytes = 0
        self._flush_bytes = flush_bytes
        self.events_written = 0
        self.closed = False

    def add_event(self, raw: bytes) -> None:
        if self._pending_bytes and self._pending_kind != RECORD_EVENTS:
            self._write_events()
        self._pending_kind = RECORD_EVENTS
        self._pending.append(EVENT_LENGTH.pack(len(raw)))
        self._pending.append(raw)
        self._pending_bytes += len(raw) + EVENT_LENGTH.size
        if self._pending_bytes >= self._flush_bytes:
            self._write_events()

    def add_ring_chunk(self, chunk: bytes) -> None:
        """A run of ring buffer records, stored as it is (no per-event work)."""
        if self._pending_bytes and self._pending_kind != RECORD_RINGBUF:
            self._write_events()
        self._pending_kind = RECORD_RINGBUF
        self._pending.append(chunk)
        self._pending_bytes += len(chunk)
        if self._pending_bytes >= self._flush_bytes:
            self._write_events()

    def _write_record(self, record_type: int, payload: bytes) -> None:
        header = RECORD_HEADER.pack(len(payload), record_type, 0, zlib.crc32(payload))
        self._file.write(header)
        self._file.write(payload)

    def _write_events(self) -> None:
        if not self._pending:
            return
        payload = b"".join(self._pending)
        if self._pending_kind == RECORD_EVENTS:
            self.events_written += len(self._pending) // 2
        self._pending.clear()
        self._pending_bytes = 0
        self._write_record(self._pending_kind, payload)

    def flush(self, stats: dict | None = None) -> None:
        """Writes buffered events (and optionally a stats record) to the OS."""
        self._write_events()
        if stats is not None:
            self._write_record(RECORD_STATS, json.dumps(stats, sort_keys=True).encode())
        self._file.flush()

    def add_snapshot(self, probe_set: str, data: dict) -> None:
        """Stores one probe set's aggregates (written at once, not buffered)."""
        self._write_events()
        payload = json.dumps({"probe_set": probe_set, "data": data}, sort_keys=True).encode()
        self._write_record(RECORD_SNAPSHOT, payload)

    def add_engine_scrape(self, scrape: dict) -> None:
        """One scrape of the engine's /metrics (collector/attach/engine_scrape.py), as parsed."""
        self._write_events()
        self._write_record(RECORD_ENGINE_METRICS, json.dumps(scrape, sort_keys=True).encode())

    def close(self, final_stats: dict) -> None:
        if self.closed:
            return
        self._write_events()
        self._write_record(RECORD_END, json.dumps(final_stats, sort_keys=True).encode())
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.closed = True


@dataclass
class Recording:
    path: Path
    meta: RecordingMeta   # a dict given here is wrapped (collector/model/recording_meta.py)
    events: list[bytes] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)
    final: dict | None = None
    snapshots: dict[str, dict] = field(default_factory=dict)  # probe set -> aggregates
    engine_scrapes: list[dict] = field(default_factory=list)  # the engine's /metrics, by time
    problem: str | None = None  # why reading stopped early, if it did

    def __post_init__(self) -> None:
        self.meta = RecordingMeta.of(self.meta)

    @property
    def complete(self) -> bool:
        return self.final is not None and self.problem is None

    def counter(self, name: str) -> int:
        """A recorder counter at the stop, or at the last periodic stats of a
        recording cut short; 0 when neither has it."""
        if self.final is not None and name in self.final:
            return int(self.final[name])
        for stats in reversed(self.stats):
            if name in stats:
                return int(stats[name])
        return 0

    @property
    def lost_events(self) -> int:
        """Events the kernel could not hand over (ring buffer full)."""
        return self.counter("lost_events")


def iter_events(payload: bytes) -> Iterator[bytes]:
    offset = 0
    end = len(payload)
    while offset + EVENT_LENGTH.size <= end:
        (length,) = EVENT_LENGTH.unpack_from(payload, offset)
        offset += EVENT_LENGTH.size
        if offset + length > end:
            raise ValueError("event runs past the end of its record")
        yield payload[offset : offset + length]
        offset += length
    if offset != end:
        raise ValueError("trailing bytes after the last event")


def check_layout(path: Path, meta: RecordingMeta) -> None:
    """Refuses events of a layout newer than this inferprobe's decoders.

    The file format can stay the same while the events inside change
    (bpf/inferprobe.h's INFERPROBE_LAYOUT_VERSION, written by `record` as
    meta.layout_version): decoding a newer layout with today's structs would
    read fields at the wrong offsets. An older layout, or none stated, is read
    as today: events shorter than today's struct are counted as undecodable
    (layout 2 only appended fields to io_event), except layout 3's I/O events,
    which lack only layout 4's first_piece_ns (collector/model/events.py DECODERS)."""
    layout = meta.layout_version
    if layout is None:
        return
    if not isinstance(layout, int) or isinstance(layout, bool):
        raise RecordingProblem(f"{path} has a corrupt header (layout_version {layout!r} is not a number)")
    if layout > LAYOUT_VERSION:
        raise RecordingProblem(
            f"{path} holds events of layout {layout}, newer than the layout {LAYOUT_VERSION} this "
            "inferprobe reads: upgrade inferprobe to read it"
        )


def read_recording(path: str | os.PathLike) -> Recording:
    """Reads every intact record; a torn tail is reported in .problem."""
    path = Path(path)
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise RecordingProblem(f"no recording at {path}") from None
    except OSError as err:
        raise RecordingProblem(f"cannot read {path}: {err.strerror}") from None
    with f:
        head = f.read(FILE_HEADER.size)
        if len(head) < FILE_HEADER.size or not head.startswith(MAGIC[:6]):
            raise RecordingProblem(f"{path} is not an inferprobe recording (bad magic)")
        magic, version, _reserved, meta_len = FILE_HEADER.unpack(head)
        if magic != MAGIC:
            raise RecordingProblem(f"{path} is not an inferprobe recording (bad magic)")
        if version > FORMAT_VERSION:
            raise RecordingProblem(
                f"{path} was written by a newer inferprobe (format {version}; this one reads "
                f"up to {FORMAT_VERSION}): upgrade inferprobe to read it"
            )
        meta_raw = f.read(meta_len)
        try:
            raw = json.loads(meta_raw)
        except (ValueError, UnicodeDecodeError):
            raise RecordingProblem(f"{path} has a corrupt header (metadata unreadable)") from None
        if not isinstance(raw, dict):
            raise RecordingProblem(f"{path} has a corrupt header (metadata is not a JSON object)")
        meta = RecordingMeta(raw)
        check_layout(path, meta)
        rec = Recording(path=path, meta=meta)
        offset = FILE_HEADER.size + meta_len
        while True:
            header = f.read(RECORD_HEADER.size)
            if not header:
                break
            if len(header) < RECORD_HEADER.size:
                rec.problem = f"truncated at byte {offset} (a torn record header)"
                break
            length, rtype, _res, crc = RECORD_HEADER.unpack(header)
            if length > MAX_RECORD_BYTES:
                rec.problem = f"corrupt at byte {offset} (record length {length})"
                break
            payload = f.read(length)
            if len(payload) < length:
                rec.problem = f"truncated at byte {offset} (last record cut short)"
                break
            if zlib.crc32(payload) != crc:
                rec.problem = f"corrupt at byte {offset} (checksum mismatch)"
                break
            try:
                if rtype == RECORD_EVENTS:
                    rec.events.extend(iter_events(payload))
                elif rtype == RECORD_RINGBUF:
                    rec.events.extend(iter_ring_records(payload))
                elif rtype == RECORD_STATS:
                    rec.stats.append(json.loads(payload))
                elif rtype == RECORD_SNAPSHOT:
                    snap = json.loads(payload)
                    rec.snapshots[snap["probe_set"]] = snap["data"]
                elif rtype == RECORD_ENGINE_METRICS:
                    rec.engine_scrapes.append(json.loads(payload))
                elif rtype == RECORD_END:
                    rec.final = json.loads(payload)
                # unknown record types from newer minor versions are skipped
            except (ValueError, KeyError, TypeError):
                rec.problem = f"corrupt at byte {offset} (record contents unreadable)"
                break
            offset += RECORD_HEADER.size + length
        if rec.problem is None and rec.final is None:
            rec.problem = NO_END_RECORD
        return rec
