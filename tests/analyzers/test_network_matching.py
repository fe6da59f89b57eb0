"""analyzers.network.match_writes: bytes written in order leave in order."""

from __future__ import annotations

from inferprobe.analyzers.network import WriteOnWire, match_writes
from inferprobe.collector.events import EventType, NetFlag, NetVia, NetXmitRecord

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
