"""analyzers.network.match_writes: bytes written in order leave in order."""

from __future__ import annotations

from inferprobe.analyzers.network import WriteOnWire, match_writes
from inferprobe.collector.model.events import EventType, NetAckRecord, NetFlag, NetVia, NetXmitRecord

HEADER = 66
NO_FLAGS = NetFlag(0)


def seg(queue_ns: int, payload: int, via=NetVia.WRITE, flags=NO_FLAGS) -> NetXmitRecord:
    return NetXmitRecord(type=EventType.NET_XMIT, pid=1, ts_ns=queue_ns + 5, queue_ns=queue_ns,
                         conn_id=1, len=HEADER + payload, rc=0, via=via, flags=flags, dev="veth0")


def test_writes_held_together_share_the_segment_that_carries_their_last_bytes():
    writes = [WriteOnWire(100, 110, 15), WriteOnWire(200, 210, 15), WriteOnWire(300, 310, 15)]
    used = match_writes(writes, [seg(105, 15), seg(400, 30, via=NetVia.ACK)], HEADER)
    assert used == 2
    assert [w.segment for w in writes] == [0, 1, 1]
    assert [w.shared for w in writes] == [False, True, True]
    assert writes[1].delay_ns == 405 - 200
    assert writes[2].via == NetVia.ACK


def test_acks_retransmissions_and_early_segments_do_not_advance_the_byte_count():
    writes = [WriteOnWire(100, 110, 10), WriteOnWire(200, 210, 10)]
    segments = [
        seg(50, 0),  # a pure ACK
        seg(150, 10, flags=NetFlag.RETRANSMIT),  # not new bytes
        seg(160, 20),  # claims more than was written by then: capped at 10
        seg(250, 10),
    ]
    match_writes(writes, segments, HEADER)
    assert [w.segment for w in writes] == [2, 3]
    assert not any(w.shared for w in writes)


def ack(ts_ns: int, snd_nxt: int) -> NetAckRecord:
    return NetAckRecord(type=EventType.NET_ACK, pid=1, ts_ns=ts_ns, conn_id=1, snd_nxt=snd_nxt,
                        snd_una=snd_nxt, snd_cwnd=10, ssthresh=100, snd_wnd=65535, srtt_us=100,
                        rcv_wnd=65535, data_len=0)


def test_a_segment_the_tracer_missed_does_not_shift_later_matches():
    # Three 10-byte writes; the second left in a segment sent from a timer,
    # which the tracer did not see; snd_nxt of the next incoming segment says so.
    base = 0xFFFFFFF0  # the sequence space wraps inside this connection
    writes = [WriteOnWire(100, 110, 10), WriteOnWire(200, 210, 10), WriteOnWire(300, 310, 10)]
    segments = [seg(105, 10), seg(400, 10, via=NetVia.ACK)]
    acks = [ack(150, base + 10), ack(390, (base + 20) & 0xFFFFFFFF)]
    match_writes(writes, segments, HEADER, acks)
    assert writes[0].segment == 0 and not writes[0].unseen
    assert writes[1].t_wire_ns is None and writes[1].unseen and writes[1].left_by_ns == 390
    assert writes[2].segment == 1 and writes[2].t_wire_ns == 405  # not the second write's segment
    assert not writes[2].shared


def test_without_incoming_segments_matching_falls_back_to_byte_counts():
    writes = [WriteOnWire(100, 110, 10), WriteOnWire(200, 210, 10)]
    match_writes(writes, [seg(105, 10), seg(250, 10)], HEADER, acks=[])
    assert [w.segment for w in writes] == [0, 1]
    assert not any(w.unseen for w in writes)


def test_a_connection_traced_mid_stream_keeps_its_held_writes():
    # Traced from mid-life: 5000 bytes of the stream left before our first write
    # was seen, and the incoming segment then says so. W2 is held (Nagle) until
    # the ACK of W1, and leaves in the segment that ACK releases.
    base = 1_000_000
    writes = [WriteOnWire(100, 110, 100), WriteOnWire(200, 210, 50)]
    segments = [seg(105, 100), seg(310, 50, via=NetVia.ACK)]
    acks = [ack(50, base - 5000), ack(300, base + 100)]
    match_writes(writes, segments, HEADER, acks)
    assert [w.segment for w in writes] == [0, 1]
    assert not any(w.unseen for w in writes)
    assert writes[1].via == NetVia.ACK
