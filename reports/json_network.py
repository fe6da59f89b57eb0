"""The "network" part of `report --format json` (docs/report-json.md), from the model's
per-connection results and network findings."""

from __future__ import annotations

from inferprobe.analyzers.findings import Finding
from inferprobe.analyzers.network import ConnectionNetwork


def tcp_info_json(c: ConnectionNetwork) -> dict | None:
    if not c.samples:
        return None
    last = c.samples[-1]["tcp_info"]
    keys = ("rtt_us", "rttvar_us", "min_rtt_us", "cwnd", "ssthresh", "mss", "unacked",
            "notsent_bytes", "retrans_total", "delivery_rate_Bps", "snd_buf", "wmem_queued",
            "peer_window", "rwnd_limited_us", "sndbuf_limited_us", "bytes_sent", "bytes_acked")
    out = {k: last.get(k) for k in keys}
    out["notsent_bytes_max"] = max(c.tcp_info_series("notsent_bytes"), default=None)
    out["samples"] = len(c.samples)
    out["local"] = last.get("local")
    out["peer"] = last.get("peer")
    return out


def connection_json(c: ConnectionNetwork) -> dict:
    return {
        "conn_id": c.conn_id,
        "pid": c.pid,
        "fd": c.fd,
        "nodelay": c.nodelay,
        "cork": c.cork,
        "sockopt_unreadable": c.sockopt_unreadable,
        "writes": len(c.writes),
        "writes_on_wire": len(c.matched),
        "writes_left_unseen": c.unseen_writes,
        "segments": c.segments,
        "coalesced_writes": c.coalesced_writes,
        "ack_released_writes": c.ack_released_writes,
        "blocked_writes": c.blocked_writes,
        "write_to_wire_ns": c.write_to_wire().as_dict(),
        "retransmits": c.retransmits,
        "zero_window_acks": sum(1 for a in c.acks if a.snd_wnd == 0),
        "header_bytes": c.header_bytes,
        "tcp_info": tcp_info_json(c),
    }


def finding_json(f: Finding) -> dict:
    return {"kind": f.kind, "conn_id": f.conn_id, "summary": f.sentence, "evidence": dict(f.figures),
            "fix": f.recommendation}


def network_json(conns: list[ConnectionNetwork], findings: list[Finding], snapshot: dict | None,
                 active: bool) -> dict:
    """findings: the model's network findings (analyzers/network.py findings())."""
    return {
        "traced": active,
        "sample_errors": (snapshot or {}).get("sample_errors", []),
        "connections": [connection_json(c) for c in conns],
        "findings": [finding_json(f) for f in findings],
    }
