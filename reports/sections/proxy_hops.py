"""The proxy hops section: each traced hop of the recording's client requests side by
side (analyzers/proxy_hops.py ties them, and makes the proxy's finding where it bunches tokens)."""

from __future__ import annotations

from inferprobe.analyzers.analysis_input import AnalysisInput
from inferprobe.analyzers.proxy_hops import ANCHOR, HopStats
from inferprobe.analyzers.units import ms
from inferprobe.reports.sections.model import AnalyzerSection, Table, source_states


def _row(hop: HopStats) -> tuple[str, ...]:
    serves = ("users" if not hop.behind
              else "the proxy " + ", ".join(f"pid {pid}" for pid in hop.behind))
    per_write = "-" if hop.events_per_write is None else f"{hop.events_per_write:.1f}"
    return (f"{hop.name} (pid {hop.pid})", serves, str(hop.requests), ms(hop.ttft_ns.p50),
            ms(hop.ttft_ns.p99), ms(hop.itl_ns.p50), ms(hop.itl_ns.p99), per_write)


def build(inp: AnalysisInput) -> AnalyzerSection | None:
    hops = inp.proxy_hops
    if hops is None:
        return None
    proxies = sorted({t.proxy_pid for t in hops.ties})
    return AnalyzerSection(
        anchor=ANCHOR,
        title="Proxy hops",
        summary=(f"{len(hops.ties)} connection(s) from the traced proxy "
                 f"{', '.join(f'pid {p}' for p in proxies)} were accepted by a traced backend: its requests "
                 "there are the proxy's requests again, counted once, at the hop that served users."),
        sources=source_states(inp.recording.meta, ["sockets", "tls"]),
        tables=(Table(caption="Each hop (ms)",
                      columns=("process", "serves", "requests", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
                               "token events per write (mean)"),
                      rows=tuple(_row(h) for h in hops.hops)),),
        notes=("Hops are tied by their socket: the proxy's connection's own port is the peer port its "
               "backend accepted. A hop through a process that is not traced, or across a network "
               "address translation, is not tied, and its requests count as served.",),
    )
