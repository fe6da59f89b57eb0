"""Retransmissions are packet loss on a path, and a late reader on loopback."""

from __future__ import annotations

import pytest

from inferprobe.analyzers.network import ConnectionNetwork, is_loopback, retransmit_finding


def _conn(peer: str | None, retransmits: int) -> ConnectionNetwork:
    return ConnectionNetwork(conn_id=1, pid=10, fd=5, peer=peer, header_bytes=0, retransmits=retransmits)


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"])
def test_a_loopback_peer_is_not_told_to_check_the_network(peer):
    finding = retransmit_finding(_conn(peer, 2))
    assert finding is not None and finding.figures["loopback"] is True
    assert "qdisc" not in finding.recommendation and "loopback" in finding.recommendation


@pytest.mark.parametrize("peer", ["10.0.0.7", "2001:db8::1", "::ffff:10.1.2.3", None, "not-an-address"])
def test_a_remote_or_unknown_peer_keeps_the_packet_loss_advice(peer):
    finding = retransmit_finding(_conn(peer, 3))
    assert finding is not None and finding.figures["loopback"] is False
    assert "qdisc" in finding.recommendation
    assert not is_loopback(peer)


def test_no_retransmission_no_finding():
    assert retransmit_finding(_conn("127.0.0.1", 0)) is None
