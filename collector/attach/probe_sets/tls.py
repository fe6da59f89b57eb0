"""The TLS probe set: the plaintext of encrypted connections, at the TLS library.

Its programs are in bpf/tls.bpf.c (a part of bpf/sock.bpf.c; this set is part_of the
sockets set's object and turns them on with tls_probes): they hand each
SSL_read/SSL_write's plaintext to the socket set's classifier, through a
kprobe-type copy of its tail-call chain (loaded by the sockets set).

It finds the TLS libraries of every target (collector/binaries/tls_libraries.py)
and attaches, per process, a uprobe at the entry and a uretprobe at the
return of SSL_read, SSL_read_ex, SSL_write and SSL_write_ex and of the
handshake (SSL_do_handshake, SSL_connect, SSL_accept: when it completed),
and an entry probe on SSL_free (its session handle may come back for another
connection). Where rustls is compiled into a file that keeps its symbols,
it probes rustls's Reader::read and Writer::write at their entry and
return. In a Go executable that links crypto/tls (collector/binaries/go_binary.py)
it probes (*Conn).Read and (*Conn).Write at their entry and at each of
their return instructions, and gives the kernel the struct offsets from a
*tls.Conn to its socket fd. Libraries mapped later (a dlopen, a new child) are picked up
by refresh(), about once a second. Auto mode turns the set on only when a
target maps a TLS library at start (verifying the chain's copy is most of
a second of start-up); --tls turns it on regardless, to watch for one
loaded later.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field

from inferprobe.collector.attach.attach_failures import AttachFailures
from inferprobe.collector.attach.libbpf import BpfObject, destroy_all
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.attach.probe_sets.sockets import is_tls_program
from inferprobe.collector.attach.uprobe_attach import Probe, attach_functions
from inferprobe.collector.binaries.go_binary import GoTlsTarget, go_tls_targets
from inferprobe.collector.binaries.tls_libraries import TlsLibrary, tls_libraries
from inferprobe.collector.processes import targets as target_procs

# Attachments of exited processes a recording's snapshot still lists (the agent's, for weeks).
MAX_EXITED = 1024


@dataclass
class TlsAttachment:
    pid: int
    path: str
    kind: str
    t_attached_ns: int = 0  # CLOCK_MONOTONIC: calls before this were not seen
    hooked: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # function -> why


class TlsProbes(ProbeSet):
    name = "tls"
    part_of = "sockets"   # its programs are in sock.bpf.o
    description = ("TLS plaintext: uprobes on OpenSSL's SSL_read/SSL_write (libssl.so, or linked in), "
                   "Go's crypto/tls and rustls (where its symbols are kept)")
    state_maps = ("tls_calls",)

    def __init__(self) -> None:
        self.mode = "auto"
        # Per process, each dropped at its exit (refresh, _forget): what the recording's snapshot says
        # of exited ones is kept in `exited`, bounded: MAX_EXITED, oldest first out
        self.attachments: list[TlsAttachment] = []
        self.unhooked: list[dict] = []  # TLS libraries found that inferprobe cannot read
        self.exited: list[TlsAttachment] = []
        self.exited_dropped = 0  # attachments of exited processes dropped at the MAX_EXITED bound
        self._done: set[tuple[int, tuple[int, int]]] = set()
        self._go_done: set[int] = set()  # pids whose executable was looked at for Go crypto/tls
        self._pending: list[TlsLibrary] = []  # emptied at after_load
        self._go_pending: list[GoTlsTarget] = []
        self.failures = AttachFailures()   # the context's, from prepare() on
        self._failed_pids: set[int] = set()   # processes whose files could not be read or hooked
        self._links: dict[int, list] = {}   # pid -> its uprobe links, detached at its exit

    def prepare(self, ctx: TargetContext) -> str | None:
        self.mode = ctx.options.get("tls", "auto")
        self.failures = ctx.attach_failures
        found = [lib for pid in ctx.pids for lib in tls_libraries(pid)]
        self._note_unhooked(found)
        self._pending = [lib for lib in found if lib.hookable]
        go = [target for pid in ctx.pids for target in go_tls_targets(pid)]
        self._note_unhooked_go(go)
        self._go_pending = [target for target in go if target.probes is not None]
        if not self._pending and not self._go_pending and self.mode != "on":
            return ("no target uses a TLS library inferprobe reads (libssl.so, OpenSSL linked into the "
                    "executable, Go's crypto/tls, rustls with its symbols); record --tls watches for one "
                    "loaded later")
        return None

    def configure(self, core: BpfObject) -> None:
        """Its uprobe programs on; the chain's copy (*_tls) is loaded with the
        syscall chain by the sockets set, which reads tls_probes."""
        core.set_constant("tls_probes", 1)
        for program in core.programs():
            if is_tls_program(program) and not program.endswith("_tls"):
                core.set_autoload(program, True)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        for lib in self._pending:
            self._attach(bpf, lib)
        for target in self._go_pending:
            self._attach_go(bpf, target)
        self._pending, self._go_pending = [], []

    def refresh(self, bpf, ctx: TargetContext) -> list[str]:
        """Attaches to TLS libraries that targets (and new children) mapped since.

        Per process: one whose files cannot be read or hooked (it exited, a file changed
        under it, the kernel refused) is recorded as a failed attach, and the others go on."""
        notes: list[str] = []
        self._forget_exited(bpf)
        for pid in target_procs.with_descendants(ctx.pids):
            if pid in self._failed_pids:
                continue
            try:
                notes.extend(self._refresh_pid(bpf, pid))
            except Exception as err:  # ELF readers raise bare Exception; a map may be full
                self._failed_pids.add(pid)   # not retried (collector/attach/attach_failures.py says why)
                self.failures.add(pid, self.name, "its TLS libraries", str(err))
        return notes

    def _tracked_pids(self) -> set[int]:
        return ({pid for pid, _ in self._done} | self._go_done | self._failed_pids | set(self._links)
                | {a.pid for a in self.attachments} | {u["pid"] for u in self.unhooked})

    def _forget_exited(self, bpf, alive=target_procs.alive) -> list[int]:
        """What is kept per process goes at its exit: its links are detached, its Go offsets
        leave the kernel's table (1024 entries), its attachments move to `exited` (bounded),
        and a reused pid is looked at afresh. Returns the pids forgotten."""
        gone = sorted(pid for pid in self._tracked_pids() if not alive(pid))
        if not gone:
            return gone
        dead = set(gone)
        links = [link for pid in gone for link in self._links.pop(pid, [])]
        if links:
            destroy_all(links)
        for pid in dead & self._go_done:
            try:
                del bpf[b"go_tls_offsets"][ctypes.c_uint32(pid)]
            except KeyError:   # never set: no Go crypto/tls in it
                pass
        self._done = {k for k in self._done if k[0] not in dead}
        self._go_done -= dead
        self._failed_pids -= dead
        self.exited.extend(a for a in self.attachments if a.pid in dead)
        self.attachments = [a for a in self.attachments if a.pid not in dead]
        self.unhooked = [u for u in self.unhooked if u["pid"] not in dead]
        if len(self.exited) > MAX_EXITED:
            self.exited_dropped += len(self.exited) - MAX_EXITED
            del self.exited[: len(self.exited) - MAX_EXITED]
        return gone

    def _refresh_pid(self, bpf, pid: int) -> list[str]:
        notes = []
        found = tls_libraries(pid)
        self._note_unhooked(found)
        for lib in found:
            if lib.hookable and (pid, lib.file_key) not in self._done:
                att = self._attach(bpf, lib)
                notes.append(f"tls: attached to {', '.join(att.hooked) or 'nothing'} of {lib.path} "
                             f"in pid {pid}")
        if pid not in self._go_done:
            go = go_tls_targets(pid)
            self._note_unhooked_go(go)
            for target in go:
                if target.probes is not None:
                    att = self._attach_go(bpf, target)
                    notes.append(f"tls: attached to {', '.join(att.hooked) or 'nothing'} of Go crypto/tls "
                                 f"in {target.path} (pid {pid})")
            self._go_done.add(pid)
        return notes

    def _note_unhooked_go(self, found: list[GoTlsTarget]) -> None:
        for target in found:
            entry = {"pid": target.pid, "path": target.path, "library": "Go crypto/tls",
                     "why": target.verdict.reason}
            if target.probes is None and entry not in self.unhooked:
                self.unhooked.append(entry)

    def _attach_go(self, bpf, target: GoTlsTarget) -> TlsAttachment:
        self._go_done.add(target.pid)
        probes = target.probes
        assert probes is not None
        att = TlsAttachment(pid=target.pid, path=target.path, kind=f"go ({probes.go_version})")
        self.attachments.append(att)
        off = probes.offsets
        table = bpf[b"go_tls_offsets"]
        table[ctypes.c_uint32(target.pid)] = table.Leaf(
            off.tls_conn_conn, off.iface_data, off.tcp_conn_conn, off.conn_fd, off.netfd_pfd, off.pfd_sysfd)
        # The entry and each return instruction, not a uretprobe (collector/binaries/go_binary.py says why).
        entries = ((probes.read, "tls_go_read_enter"), (probes.write, "tls_go_write_enter"))
        att.hooked, att.failed = attach_functions(bpf, target.host_path, target.pid, [
            (function.name, [Probe(function.address, entry),
                             *(Probe(address, "tls_go_return") for address in function.returns)])
            for function, entry in entries], links=self._links.setdefault(target.pid, []))
        att.t_attached_ns = time.monotonic_ns()
        self.failures.add_functions(target.pid, self.name, f"Go crypto/tls in {target.path}", att.failed)
        return att

    def _note_unhooked(self, found: list[TlsLibrary]) -> None:
        for lib in found:
            entry = {"pid": lib.pid, "path": lib.path, "library": lib.kind}
            if not lib.hookable and entry not in self.unhooked:
                self.unhooked.append(entry)

    def _attach(self, bpf, lib: TlsLibrary) -> TlsAttachment:
        self._done.add((lib.pid, lib.file_key))
        att = TlsAttachment(pid=lib.pid, path=lib.path, kind=lib.kind)
        self.attachments.append(att)
        if _file_key(lib.host_path) != lib.file_key:
            # Replaced on disk since it was mapped: a uprobe on the path would go to the new file.
            att.failed = {name: "the file changed on disk since the process mapped it"
                          for name in sorted(lib.functions)}
            self.failures.add_functions(lib.pid, self.name, lib.path, att.failed)
            return att
        att.hooked, att.failed = attach_functions(bpf, lib.host_path, lib.pid, [
            (function, [Probe(address, entry), *([Probe(address, ret, on_return=True)] if ret else [])])
            for function, address, entry, ret in lib.probe_programs()],
            links=self._links.setdefault(lib.pid, []))
        att.t_attached_ns = time.monotonic_ns()
        self.failures.add_functions(lib.pid, self.name, lib.path, att.failed)
        return att

    def snapshot(self, bpf) -> dict:
        return {
            "mode": self.mode,
            "attachments": [vars(a) for a in (*self.exited, *self.attachments)],
            "attachments_dropped": self.exited_dropped,
            "unhooked": self.unhooked,
            "sessions": sum(1 for _ in bpf[b"tls_sessions"].keys()),
        }


def _file_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
