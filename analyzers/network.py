"""Per connection: when each write left the host, what held it, and what to do about it.

Inputs are the recording's decoded events (the server's writes from the
socket set; segments, incoming-segment samples and retransmissions from the
network set) and the tcp_info/socket-option samples in the network set's
snapshot. No I/O here.

Matching writes to segments. TCP sends a connection's bytes in order, so the
k-th byte written is the k-th payload byte transmitted (retransmissions
aside). A segment's payload is its frame length less the headers:
Ethernet (14, as on lo and veth), IPv4 (20) or IPv6 (40), TCP (20, plus 12
when the connection uses timestamps: tcp_info says so). Walking writes and
segments in time order, a write "reaches the wire" with the segment that
carries its last byte; writes whose last bytes leave in the same segment
were coalesced. Each incoming segment's snd_nxt (tcp_probe) re-anchors the
count, so a segment the tracer missed cannot shift the later matches.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferprobe.analyzers.cadence import Distribution
from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.units import ms
from inferprobe.collector.model.events import (
    Event,
    IoRecord,
    NetAckRecord,
    NetFlag,
    NetRetransmitRecord,
    NetVia,
    NetXmitRecord,
)
from inferprobe.collector.model.timeline import Connection

ETH_HEADER = 14
TCP_HEADER = 20
TCP_TIMESTAMP_OPTION = 12
TCPI_OPT_TIMESTAMPS = 1

# Thresholds for findings; each finding carries the figures that crossed them.
NAGLE_MIN_HELD_WRITES = 2  # small writes that waited for an ACK
HELD_DELAY_NS = 1_000_000  # a write that left more than 1 ms after it was made was held
BLOCKED_WRITE_NS = 1_000_000  # a write() that took this long waited for send-buffer space
SNDBUF_PRESSURE_RATIO = 0.5  # queued bytes / send buffer


@dataclass
class WriteOnWire:
    t_write_ns: int  # write() entry
    t_exit_ns: int
    bytes: int
    t_queue_ns: int | None = None  # the segment carrying its last byte, at net_dev_queue
    t_wire_ns: int | None = None  # ... at net_dev_xmit
    segment: int | None = None  # index of that segment in the connection
    via: NetVia | None = None
    shared: bool = False  # its last byte left in a segment with the last byte of another write
    unseen: bool = False  # its last byte left in a segment the tracer did not see (match_writes)
    left_by_ns: int | None = None  # ... which had left by this time (an incoming segment's snd_nxt)

    @property
    def delay_ns(self) -> int | None:
        return None if self.t_wire_ns is None else self.t_wire_ns - self.t_write_ns


@dataclass
class ConnectionNetwork:
    conn_id: int
    pid: int
    fd: int | None
    peer: str | None
    header_bytes: int
    writes: list[WriteOnWire] = field(default_factory=list)
    segments: int = 0
    retransmits: int = 0
    acks: list[NetAckRecord] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # tcp_state samples of this socket

    @property
    def matched(self) -> list[WriteOnWire]:
        return [w for w in self.writes if w.t_wire_ns is not None]

    @property
    def coalesced_writes(self) -> int:
        return sum(1 for w in self.writes if w.shared)

    @property
    def unseen_writes(self) -> int:
        return sum(1 for w in self.writes if w.unseen)

    @property
    def ack_released_writes(self) -> int:
        """Writes that did not leave inside their own write() but after an incoming ACK."""
        return sum(1 for w in self.writes if w.via == NetVia.ACK)

    @property
    def blocked_writes(self) -> int:
        return sum(1 for w in self.writes if w.t_exit_ns - w.t_write_ns >= BLOCKED_WRITE_NS)

    @property
    def nodelay(self) -> bool | None:
        known = [s["nodelay"] for s in self.samples if s.get("nodelay") is not None]
        return known[-1] if known else None

    @property
    def cork(self) -> bool | None:
        known = [s["cork"] for s in self.samples if s.get("cork") is not None]
        return known[-1] if known else None

    @property
    def sockopt_unreadable(self) -> str | None:
        if not self.samples:
            return "no tcp_info sample matched this connection (closed between samples, or not TCP)"
        if self.nodelay is None:
            return self.samples[-1].get("sockopt_unreadable")
        return None

    def write_to_wire(self) -> Distribution:
        return Distribution.of([w.delay_ns for w in self.matched if w.delay_ns is not None])

    def tcp_info_series(self, name: str) -> list[int]:
        return [s["tcp_info"][name] for s in self.samples if s["tcp_info"].get(name) is not None]


def header_bytes(conn: Connection | None, samples: list[dict]) -> int:
    ip = 20
    if conn is not None and conn.family == "ipv6" and not (conn.peer or "").startswith("::ffff:"):
        ip = 40
    options = next((s["tcp_info"].get("options") for s in samples if s.get("tcp_info")), None)
    timestamps = True if options is None else bool(options & TCPI_OPT_TIMESTAMPS)  # Linux default
    return ETH_HEADER + ip + TCP_HEADER + (TCP_TIMESTAMP_OPTION if timestamps else 0)


def _samples_of(conn: Connection | None, pid: int, fd: int | None, samples: list[dict]) -> list[dict]:
    """The samples of this connection's socket: same pid and fd, inside its lifetime."""
    if fd is None:
        return []
    out = []
    for s in samples:
        if s["pid"] != pid or s["fd"] != fd:
            continue
        if conn is not None and conn.t_open_ns is not None and s["t_ns"] < conn.t_open_ns:
            continue
        if conn is not None and conn.t_close_ns is not None and s["t_ns"] > conn.t_close_ns:
            continue
        out.append(s)
    return out


class _Written:
    """Bytes the server had begun writing by a time: asked at increasing times."""

    def __init__(self, writes: list[WriteOnWire]):
        self.writes = writes
        self.ends: list[int] = []  # running total after each write
        total = 0
        for w in writes:
            total += w.bytes
            self.ends.append(total)
        self._begun = 0

    def by(self, t_ns: int) -> int:
        while self._begun < len(self.writes) and self.writes[self._begun].t_write_ns <= t_ns:
            self._begun += 1
        return self.ends[self._begun - 1] if self._begun else 0


def _new_payload(seg: NetXmitRecord, header: int) -> int:
    """New bytes a segment carries: none for a pure ACK, a retransmission or a failed send."""
    if NetFlag.RETRANSMIT in seg.flags or seg.rc != 0:
        return 0
    return max(0, seg.len - header)


def _signed32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def sequence_base(writes: list[WriteOnWire], segments: list[NetXmitRecord],
                  acks: Sequence[NetAckRecord], header: int) -> int | None:
    """TCP's sequence number for the first byte we saw written (writes, segments and
    acks in time order), from tcp_probe's snd_nxt; None when nothing can say.

    Two bounds, both from incoming segments that came after the first of our
    bytes was seen leaving:
    - snd_nxt less the payload of the segments we saw queued before it is
      the base plus the bytes of any segment we missed: an upper bound
      (the count never runs ahead, the header size being right), exact once
      one incoming segment had no missed segment before it;
    - snd_nxt less the bytes written by then is a lower bound: no more of
      our bytes can have left than had been written. It is exact whenever
      everything written had left, and it keeps a count that did run ahead
      (a header misjudged) from dragging the base below the truth.
    Incoming segments before our first byte left say nothing: on a
    connection traced from mid-life the stream's earlier bytes are not ours."""
    written = _Written(writes)
    upper, lower = [], []
    counted = 0
    pending = iter(segments)
    seg = next(pending, None)
    for ack in acks:
        while seg is not None and seg.queue_ns < ack.ts_ns:
            counted = min(counted + _new_payload(seg, header), written.by(seg.queue_ns))
            seg = next(pending, None)
        if counted > 0:
            upper.append((ack.snd_nxt - counted) & 0xFFFFFFFF)
            lower.append((ack.snd_nxt - written.by(ack.ts_ns)) & 0xFFFFFFFF)
    if not upper:
        return None
    first = upper[0]
    low = min(_signed32(c - first) for c in upper)
    high = max(_signed32(c - first) for c in lower)
    return (first + max(low, high)) & 0xFFFFFFFF


def match_writes(writes: list[WriteOnWire], segments: list[NetXmitRecord], header: int,
                 acks: Sequence[NetAckRecord] = ()) -> int:
    """Marks each write with the segment carrying its last byte; returns segments used.

    Only bytes written before a segment was queued can be in it, which keeps
    a misjudged header size from running the match ahead. A segment we could
    not see (sent from a TCP timer, say) would make the count fall behind and
    give later writes a later segment than the one that carried them; so at
    each incoming segment the count is set from TCP's own snd_nxt (tcp_probe),
    and writes completed by that correction are marked `unseen`: they left
    before that moment, in a segment the tracer did not time. The correction
    waits for the next incoming segment: a seen segment that follows a missed
    one with no ACK in between is still credited with the missed bytes.
    """
    writes.sort(key=lambda w: w.t_write_ns)
    segments = sorted(segments, key=lambda s: s.queue_ns)
    acks = sorted(acks, key=lambda a: a.ts_ns)
    base = sequence_base(writes, segments, acks, header)
    written = _Written(writes)
    sent = 0
    next_write = 0
    next_ack = 0
    used = 0

    def complete() -> list[WriteOnWire]:
        nonlocal next_write
        done = []
        while next_write < len(writes) and written.ends[next_write] <= sent:
            done.append(writes[next_write])
            next_write += 1
        return done

    def anchor(until_ns: int) -> None:
        nonlocal next_ack, sent
        while next_ack < len(acks) and acks[next_ack].ts_ns < until_ns:
            ack = acks[next_ack]
            next_ack += 1
            if base is None:
                continue
            truth = min(sent + _signed32(ack.snd_nxt - base - sent), written.by(ack.ts_ns))
            if truth > sent:
                sent = truth
                for w in complete():
                    w.unseen = True
                    w.left_by_ns = ack.ts_ns

    for index, seg in enumerate(segments):
        anchor(seg.queue_ns)
        payload = _new_payload(seg, header)
        if payload <= 0:
            continue
        used += 1
        sent = min(sent + payload, written.by(seg.queue_ns))
        done = complete()
        for w in done:
            w.t_queue_ns = seg.queue_ns
            w.t_wire_ns = seg.ts_ns
            w.segment = index
            w.via = seg.via
            w.shared = len(done) > 1
    anchor(1 << 63)
    return used


def analyze(
    events: list[Event], connections: list[Connection], snapshot: dict | None
) -> list[ConnectionNetwork]:
    samples = (snapshot or {}).get("tcp_samples", [])
    by_id = {c.conn_id: c for c in connections}
    writes: dict[int, list[WriteOnWire]] = defaultdict(list)
    segments: dict[int, list[NetXmitRecord]] = defaultdict(list)
    acks: dict[int, list[NetAckRecord]] = defaultdict(list)
    retransmits: dict[int, int] = defaultdict(int)
    owner: dict[int, tuple[int, int | None]] = {}
    for ev in events:
        if isinstance(ev, IoRecord):
            if not ev.is_read and ev.bytes > 0:
                writes[ev.conn_id].append(WriteOnWire(ev.ts_ns, ev.exit_ns, ev.bytes))
            owner.setdefault(ev.conn_id, (ev.pid, ev.fd))
        elif isinstance(ev, NetXmitRecord):
            segments[ev.conn_id].append(ev)
        elif isinstance(ev, NetAckRecord):
            acks[ev.conn_id].append(ev)
        elif isinstance(ev, NetRetransmitRecord):
            retransmits[ev.conn_id] += 1
    out = []
    for conn_id in sorted(set(segments) | set(acks) | set(retransmits)):
        if conn_id not in writes:
            continue  # not an HTTP connection the socket set followed
        conn = by_id.get(conn_id)
        pid, fd = owner.get(conn_id, (conn.pid if conn else 0, conn.fd if conn else None))
        mine = _samples_of(conn, pid, fd, samples)
        result = ConnectionNetwork(
            conn_id=conn_id, pid=pid, fd=fd, peer=None if conn is None else conn.peer,
            header_bytes=header_bytes(conn, mine), writes=writes[conn_id],
            retransmits=retransmits[conn_id], acks=acks[conn_id], samples=mine,
        )
        result.segments = match_writes(result.writes, segments[conn_id], result.header_bytes,
                                       acks[conn_id])
        out.append(result)
    return out


# -- findings ------------------------------------------------------------------


def nagle_finding(c: ConnectionNetwork) -> Finding | None:
    """Small writes held until an ACK came back, with TCP_NODELAY not set."""
    if c.nodelay is True:
        return None
    mss = max(c.tcp_info_series("mss") or [1448])
    held = [w for w in c.matched if w.via == NetVia.ACK and w.bytes < mss
            and (w.delay_ns or 0) >= HELD_DELAY_NS]
    if len(held) < NAGLE_MIN_HELD_WRITES and c.coalesced_writes < NAGLE_MIN_HELD_WRITES:
        return None
    delays = c.write_to_wire()
    state = "off" if c.nodelay is False else f"unknown ({c.sockopt_unreadable})"
    return Finding(
        kind="nagle_coalescing",
        source="network",
        conn_id=c.conn_id,
        sentence=(f"{len(held)} small writes waited for an ACK before leaving and {c.coalesced_writes} "
                  "left in a segment shared with another write; write->wire p99 "
                  f"{ms(delays.p99, places=1, unit=True)}, TCP_NODELAY {state}"),
        figures={
            "nodelay": c.nodelay,
            "writes": len(c.writes),
            "held_until_ack": len(held),
            "coalesced_writes": c.coalesced_writes,
            "write_to_wire_p99_ns": delays.p99,
            "write_to_wire_max_ns": delays.max,
            "mss": mss,
        },
        recommendation=("set TCP_NODELAY on the server's socket (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, "
                        "1); uvicorn/aiohttp set it by default, a hand-written server or a proxy may not: "
                        "nginx 'tcp_nodelay on' with 'proxy_buffering off' for event streams)"),
    )


def send_buffer_finding(c: ConnectionNetwork) -> Finding | None:
    notsent = c.tcp_info_series("notsent_bytes")
    queued = c.tcp_info_series("wmem_queued")
    sndbuf = c.tcp_info_series("snd_buf")
    ratio = max((q / b for q, b in zip(queued, sndbuf, strict=False) if b), default=0.0)
    growing = len(notsent) >= 2 and notsent[-1] > notsent[0] and max(notsent) > 0
    if not (c.blocked_writes or ratio >= SNDBUF_PRESSURE_RATIO or growing):
        return None
    return Finding(
        kind="send_buffer_pressure",
        source="network",
        conn_id=c.conn_id,
        sentence=(f"{c.blocked_writes} writes blocked for >= {ms(BLOCKED_WRITE_NS, places=1, unit=True)}; "
                  f"not-sent bytes peaked at {max(notsent, default=0)}, queued/send buffer up to "
                  f"{ratio:.0%}"),
        figures={
            "blocked_writes": c.blocked_writes,
            "notsent_bytes_max": max(notsent, default=None),
            "notsent_bytes_first_last": [notsent[0], notsent[-1]] if notsent else None,
            "wmem_queued_to_sndbuf_max": round(ratio, 3),
            "snd_buf": sndbuf[-1] if sndbuf else None,
        },
        recommendation=("the peer or the path takes bytes slower than the server makes them: find the "
                        "slow reader (see slow_reader) or the bottleneck link; a larger SO_SNDBUF only "
                        "hides it, and TCP_NOTSENT_LOWAT keeps the backlog (and the latency it adds) small"),
    )


def slow_reader_finding(c: ConnectionNetwork) -> Finding | None:
    windows = [a.snd_wnd for a in c.acks]
    zero = sum(1 for w in windows if w == 0)
    rwnd_limited = max(c.tcp_info_series("rwnd_limited_us"), default=0)
    if not zero and not rwnd_limited:
        return None
    return Finding(
        kind="slow_reader",
        source="network",
        conn_id=c.conn_id,
        sentence=(f"the client's receive window was closed in {zero} of {len(windows)} incoming "
                  f"segments; sending was receive-window limited for {rwnd_limited / 1000:.1f} ms"),
        figures={"zero_window_acks": zero, "acks": len(windows),
                  "min_peer_window": min(windows, default=None), "rwnd_limited_us": rwnd_limited},
        recommendation=("the client reads its socket too slowly: make it read as events arrive (no blocking "
                        "work in the read loop), or give it a larger receive buffer"),
    )


def is_loopback(peer: str | None) -> bool:
    """A peer on this host's loopback (127/8, ::1, or 127/8 mapped into IPv6)."""
    if peer is None:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def retransmit_finding(c: ConnectionNetwork) -> Finding | None:
    total = max(c.tcp_info_series("retrans_total"), default=0)
    if not c.retransmits and not total:
        return None
    loopback = is_loopback(c.peer)
    if loopback:
        # No link, no qdisc between the two ends: a segment is resent when the receiver
        # dropped it (its receive queue or backlog full, a client reading late) or a
        # timer fired before its ACK (a tail-loss probe, an RTO on a stalled reader).
        recommendation = ("the client is on this host, over loopback, where nothing is lost in transit: "
                          "the receiver's queue was full or its ACK late; look at how promptly the client "
                          "reads (see slow_reader), not at the network")
    else:
        recommendation = ("packets are lost between server and client: check interface and qdisc drops "
                          "(ip -s link, tc -s qdisc) and the path; retransmissions are not the server's "
                          "doing")
    return Finding(
        kind="retransmits",
        source="network",
        conn_id=c.conn_id,
        sentence=f"{max(c.retransmits, total)} segments were retransmitted: each costs at least an RTT",
        figures={"retransmit_events": c.retransmits, "tcp_info_retrans_total": total, "loopback": loopback},
        recommendation=recommendation,
    )


FINDERS = (nagle_finding, send_buffer_finding, slow_reader_finding, retransmit_finding)


def findings(conns: list[ConnectionNetwork]) -> list[Finding]:
    return [f for c in conns for finder in FINDERS if (f := finder(c)) is not None]
