"""The network probe set (bpf/net.bpf.c): when written bytes leave the host, and TCP state.

Kernel side: per traced connection, every segment's device-layer times
(net_dev_queue, net_dev_xmit), incoming segments as tcp:tcp_probe reports
them (windows, cwnd, srtt) and retransmissions. User side, at attach and
about once a second: TCP_NODELAY/TCP_CORK read from the target's socket and
tcp_info from socket diagnostics (collector/processes/tcp_state.py), stored in the
recording's SNAPSHOT for this set.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.attach.probe_sets.sockets import NETWORK_PROGRAMS, READ_ENTRY_PROGRAMS

if TYPE_CHECKING:  # at run time after_load imports it, once the set is attached
    from inferprobe.collector.processes.tcp_state import TcpStateSampler

TRACEFS_EVENTS = Path("/sys/kernel/tracing/events")

# Every tracepoint net.bpf.c attaches to, and what is lost without it.
TRACEPOINTS = {
    "sock/sock_send_length": "which socket a write() went to",
    "sock/sock_recv_length": "which socket a read() came from",
    "sock/inet_sock_set_state": "when a socket closes (its address may be reused)",
    "tcp/tcp_probe": "incoming segments: ACK-clocked transmits, windows, cwnd",
    "tcp/tcp_retransmit_skb": "retransmissions",
    "net/net_dev_queue": "when TCP hands a segment to the device layer",
    "net/net_dev_xmit": "when the driver takes it",
}
SAMPLE_INTERVAL_S = 1.0


def missing_tracepoints(events_dir: Path = TRACEFS_EVENTS) -> list[str]:
    return [name for name in TRACEPOINTS if not (events_dir / name / "format").exists()]


class NetworkProbes(ProbeSet):
    name = "network"
    state_maps = ("net_socks", "net_skbs")
    part_of = "sockets"   # bpf/net.bpf.c is compiled into sock.bpf.o
    description = "write -> wire delay per token chunk, segment coalescing, TCP state per connection"

    def __init__(self) -> None:
        self.sampler: TcpStateSampler | None = None
        self.ctx: TargetContext | None = None
        self._next_sample = 0.0

    def prepare(self, ctx: TargetContext) -> str | None:
        missing = missing_tracepoints()
        if missing:
            return "this kernel lacks the tracepoint(s) " + ", ".join(
                f"{name} ({TRACEPOINTS[name]})" for name in missing
            )
        return None

    def configure(self, core: BpfObject) -> None:
        # net.bpf.c ties a socket to its connection from inside the read or
        # write under way (pending_peek): sock.bpf.c must keep the reads'
        # entry programs, which it otherwise leaves out (reads_at_exit). Its
        # sock:inet_sock_set_state part runs in sock.bpf.c's program of it.
        core.set_constant("reads_at_exit", 0)
        core.set_constant("net_socket_state", 1)
        for program in (*NETWORK_PROGRAMS, *READ_ENTRY_PROGRAMS):
            core.set_autoload(program, True)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        from inferprobe.collector.processes.tcp_state import TcpStateSampler

        self.sampler = TcpStateSampler()
        self.ctx = ctx
        self._sample(ctx)

    def _sample(self, ctx: TargetContext) -> None:
        from inferprobe.collector.processes import targets as target_procs

        assert self.sampler is not None, "after_load starts the sampler"
        self._next_sample = time.monotonic() + SAMPLE_INTERVAL_S
        # Workers forked since attach hold connections too.
        self.sampler.sample(target_procs.with_descendants(ctx.pids))

    def refresh(self, bpf, ctx: TargetContext) -> None:
        if self.sampler is not None and time.monotonic() >= self._next_sample:
            self._sample(ctx)

    def snapshot(self, bpf) -> dict | None:
        if self.sampler is None or self.ctx is None:  # after_load sets both
            return None
        self._sample(self.ctx)  # the state at stop, however long since the last sample
        self.sampler.close()
        return {"tcp_samples": self.sampler.samples, "sample_errors": self.sampler.errors}
