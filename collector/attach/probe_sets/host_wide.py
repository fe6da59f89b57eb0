"""The host-wide probe set (bpf/host_wide.bpf.c): targets found without a pid.

Kernel side, a process becomes a target when it listens or accepts and
passes the filters. This side fills the filters in, lists what the kernel
adopted (so the other probe sets' refresh, which reads ctx.pids, attaches
to those processes too), adopts every few seconds the processes a /proc scan
finds listening that the kernel could not see start (a listener inherited
from a process that was filtered out), and releases the processes that
serve no HTTP: "serves HTTP" is known from the first request line the
classifier finds on one of its connections (sock.bpf.c marks the socket
entry http_seen).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field

from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.model.connection_tallies import read_tallies
from inferprobe.collector.processes import host_wide
from inferprobe.collector.processes import targets as target_procs

SCAN_INTERVAL_S = 5.0
# Adopted processes that exited, kept for the recording's snapshot: an agent
# runs for weeks while servers come and go, so the oldest go first past this.
MAX_EXITED = 1024
# A process is released once this many of its connections moved bytes and
# none carried a request line (ssh, a database, a message broker).
RELEASE_AFTER_UNRECOGNISED = 3
FOLLOW_ALL = 0xFFFFFFFF

HOST_WIDE_COUNTERS = ("conns_accepted", "conns_followed", "adopted", "filtered")


@dataclass
class Adopted:
    pid: int
    comm: str
    how: str        # "listen", "accept" or "scan" (found listening in /proc), "start"
    port: int       # 0: unknown or a Unix socket
    t_ns: int       # CLOCK_MONOTONIC when it was adopted


@dataclass
class HostWideState:
    """What the set has learned, for the recording and the live labels."""

    # The live ones; each moves to `exited` at its exit (forget_exited)
    adopted: dict[int, Adopted] = field(default_factory=dict)
    serving_http: set[int] = field(default_factory=set)   # pids a request line was read from
    released: dict[int, str] = field(default_factory=dict)   # pid -> comm
    # (process, whether it served HTTP, whether it was released); bounded: MAX_EXITED, oldest first out
    exited: list[tuple[Adopted, bool, bool]] = field(default_factory=list)
    exited_dropped: int = 0   # exited processes dropped at that bound


class HostWideProbes(ProbeSet):
    name = "host_wide"
    part_of = "sockets"   # bpf/host_wide.bpf.c is compiled into sock.bpf.o
    description = "every process that listens or accepts, filtered by port, name and cgroup"
    state_maps = ("host_wide_adopted",)

    def __init__(self) -> None:
        self.filters = host_wide.Filters()
        self.scanner = host_wide.ListenerScan()
        self.state = HostWideState()
        self.follow_ratio = 1.0
        self._next_scan = 0.0

    def prepare(self, ctx: TargetContext) -> str | None:
        self.filters = (ctx.options.get("host_wide") or {}).get("filters", host_wide.Filters())
        for pid in ctx.pids:
            self._note(pid, "start", 0, time.monotonic_ns())
        return None

    def configure(self, core: BpfObject) -> None:
        core.set_constant("host_wide_on", 1)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        table = bpf[b"host_wide_config"]
        cfg = table.Leaf()
        cfg.self_tgid = host_wide.own_host_pid()
        cfg.n_ports = len(self.filters.ports)
        for i, port in enumerate(self.filters.ports):
            cfg.ports[i] = port
        if self.filters.comm is not None:
            raw = self.filters.comm.encode()
            cfg.comm_len = len(raw)
            # a char[16] (signed bytes in the BTF-made type), zero-padded: the bytes as they are
            ctypes.memmove(ctypes.addressof(cfg) + type(cfg).comm.offset, raw, min(len(raw), len(cfg.comm)))
        if self.filters.cgroup is not None:
            cfg.cgroup_id = self.filters.cgroup.id
            cfg.cgroup_level = self.filters.cgroup.level
        cfg.follow_threshold = FOLLOW_ALL
        table[ctypes.c_int(0)] = cfg
        self._next_scan = time.monotonic() + SCAN_INTERVAL_S

    def set_follow_ratio(self, bpf, ratio: float) -> None:
        """Follow this share of new connections in full (the agent's CPU budget)."""
        ratio = min(1.0, max(0.0, ratio))
        table = bpf[b"host_wide_config"]
        cfg = table[ctypes.c_int(0)]
        cfg.follow_threshold = FOLLOW_ALL if ratio >= 1.0 else int(ratio * FOLLOW_ALL)
        table[ctypes.c_int(0)] = cfg
        self.follow_ratio = ratio

    def counters(self, bpf) -> dict[str, int]:
        table = bpf[b"host_wide_counters"]
        return {name: int(sum(table[ctypes.c_int(i)])) for i, name in enumerate(HOST_WIDE_COUNTERS)}

    def target_names(self) -> dict[int, str]:
        return {a.pid: a.comm for a in self.state.adopted.values() if a.pid not in self.state.released}

    def _note(self, pid: int, how: str, port: int, t_ns: int) -> bool:
        if pid in self.state.adopted:
            return False
        self.state.adopted[pid] = Adopted(pid, target_procs.process_name(pid), how, port, t_ns)
        return True

    def refresh(self, bpf, ctx: TargetContext) -> list[str]:
        notes = []
        table = bpf[b"host_wide_adopted"]
        for key, value in list(table.items()):
            pid = key.value
            how = {1: "listen", 2: "accept"}.get(value.how, "?")
            if self._note(pid, how, value.port, value.ts_ns):
                notes.append(self._adopted_line(pid))
            del table[key]
        if time.monotonic() >= self._next_scan:
            self._next_scan = time.monotonic() + SCAN_INTERVAL_S
            self.forget_exited(bpf, ctx)
            notes.extend(self._scan(bpf))
            notes.extend(self._release_non_http(bpf))
        # The other sets attach per process (TLS libraries, USDT, GPU) from ctx.pids.
        for pid in self.state.adopted:
            if pid not in ctx.pids and pid not in self.state.released and target_procs.alive(pid):
                ctx.pids.append(pid)
        return notes

    def forget_exited(self, bpf, ctx: TargetContext, alive=target_procs.alive) -> set[int]:
        """Adopted processes that exited leave the live state: their entry moves to the
        bounded `exited` list, they leave ctx.pids (which every set walks each second), a
        released one leaves host_wide_rejected, and their socket entries leave `socks`
        (exit closes their sockets without a close() the programs see; socks is an LRU of
        65,536, so this keeps it to live connections rather than bounding it). A reused pid
        is adopted afresh. Returns the pids forgotten."""
        state = self.state
        dead = {pid for pid in state.adopted if not alive(pid)}
        if not dead:
            return dead
        rejected = bpf[b"host_wide_rejected"]
        for pid in sorted(dead, key=lambda p: state.adopted[p].t_ns):
            state.exited.append((state.adopted.pop(pid), pid in state.serving_http, pid in state.released))
            if state.released.pop(pid, None) is not None:
                try:   # a process that reuses the pid is judged afresh
                    del rejected[ctypes.c_uint32(pid)]
                except KeyError:
                    pass
        state.serving_http -= dead
        if len(state.exited) > MAX_EXITED:
            state.exited_dropped += len(state.exited) - MAX_EXITED
            del state.exited[: len(state.exited) - MAX_EXITED]
        ctx.pids[:] = [pid for pid in ctx.pids if pid not in dead]
        socks = bpf[b"socks"]
        for key in [key for key, _state in socks.items() if key.pid in dead]:
            try:
                del socks[key]
            except KeyError:   # closed meanwhile
                pass
        return dead

    def _adopted_line(self, pid: int) -> str:
        a = self.state.adopted[pid]
        where = f" port {a.port}" if a.port else ""
        return f"host-wide: following pid {pid} ({a.comm}), seen to {a.how}{where}"

    def _scan(self, bpf) -> list[str]:
        from inferprobe.collector.attach.target_bitmap import add_targets

        serving = self.scanner.scan()
        found = [pid for pid in host_wide.matching_listeners(self.filters, serving)
                 if pid not in self.state.adopted and pid not in self.state.released]
        if not found:
            return []
        add_targets(bpf, target_procs.with_descendants(found))
        now = time.monotonic_ns()
        for pid in found:
            self._note(pid, "scan", min(serving[pid]), now)
        return [self._adopted_line(pid) for pid in found]

    def _release_non_http(self, bpf) -> list[str]:
        """Stops following processes whose connections carry no HTTP."""
        from inferprobe.collector.attach.target_bitmap import remove_targets

        unrecognised: dict[int, int] = {}
        socks = bpf[b"socks"]
        entries = list(socks.items())
        for key, state in entries:
            if state.http_seen or state.tls:
                self.state.serving_http.add(key.pid)
            elif state.unrecognised:
                unrecognised[key.pid] = unrecognised.get(key.pid, 0) + 1
        notes = []
        for pid, n in unrecognised.items():
            if n < RELEASE_AFTER_UNRECOGNISED or pid in self.state.serving_http or pid in self.state.released:
                continue
            if pid not in self.state.adopted:
                continue   # not ours to release: the user's own -p target would never be here
            bpf[b"host_wide_rejected"][ctypes.c_uint32(pid)] = ctypes.c_uint32(1)
            family = [p for p in target_procs.with_descendants([pid]) if p not in self.state.serving_http]
            remove_targets(bpf, family + _threads(family))
            for key, _state in entries:
                if key.pid in family:
                    try:
                        del socks[key]
                    except KeyError:
                        pass
            self.state.released[pid] = self.state.adopted[pid].comm
            notes.append(f"host-wide: released pid {pid} ({self.state.released[pid]}): "
                         f"{n} connections, none carrying HTTP")
        return notes

    def snapshot(self, bpf) -> dict:
        exited = self.state.exited
        return {
            "filters": self.filters.as_dict(),
            "adopted": [vars(a) for a, _, _ in exited] + [vars(a) for a in self.state.adopted.values()],
            "serving_http": sorted(self.state.serving_http | {a.pid for a, served, _ in exited if served}),
            "released": sorted(set(self.state.released) | {a.pid for a, _, released in exited if released}),
            "exited_dropped": self.state.exited_dropped,
            "counters": self.counters(bpf),
            "tallies": read_tallies(bpf).as_dict(),
            "follow_ratio": self.follow_ratio,
            "scans": self.scanner.scans,
        }


def host_wide_set(tracer) -> HostWideProbes:
    """The loaded tracer's host-wide set (record --all, agent)."""
    probe_set = tracer.active["host_wide"]
    assert isinstance(probe_set, HostWideProbes)
    return probe_set


def _threads(pids: list[int]) -> list[int]:
    found: list[int] = []
    for pid in pids:
        try:
            found.extend(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        except OSError:
            continue
    return found
