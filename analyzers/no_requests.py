"""Why a recording holds no request: one sentence, with what to try.

A report that only says "requests 0" leaves the user guessing between the
wrong pid, an idle server and traffic inferprobe cannot read (TLS, HTTP/2 begun before attach).
The recording tells them apart: whether the targets listened, which ancestor
did, how many connections were accepted, and how many reads and writes the
kernel dropped because no connection carried an HTTP/1.x request line.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferprobe.analyzers import unread_traffic
from inferprobe.collector.model.recording import Recording
from inferprobe.collector.model.timeline import Connection, Request


def explain(recording: Recording, requests: Sequence[Request],
            connections: Sequence[Connection]) -> str | None:
    """None when there are requests; else why there are none, as one sentence."""
    if requests:
        return None
    meta = recording.meta
    pids = ", ".join(str(t.pid) for t in meta.targets) or "?"
    hint = meta.serving_ancestor
    if not meta.listening:
        where = (f"; the listening process is PID {hint.pid}, the {hint.relation} of the one you "
                 f"gave: record -p {hint.pid}" if hint else "")
        return (f"No HTTP request: pid {pids} held no listening socket and made no outbound HTTP/1.x call "
                f"while recording{where} (inferprobe sees the requests a process serves and the calls it "
                "makes; a batch job shows only its locks, stacks, GPU calls and off-CPU time).")
    if hint and (hint.shared or hint.listens_too) and not any(c.role == "server" for c in connections):
        # An engine's child (vLLM's EngineCore) inherited its parent's socket, or listens
        # only for its parent's IPC: its connections are no sign of TLS or HTTP/2, nor is it idle.
        sockets = _listed(meta.listening)
        why = (f"its listening socket ({sockets}) is inherited from PID {hint.pid}, the "
               f"{hint.relation} of the one you gave, which holds it too and serves it"
               if hint.shared else
               f"PID {hint.pid}, the {hint.relation} of the one you gave, listens too "
               f"({_listed(list(hint.its_listening))}) and is likely the process that serves, the "
               f"pid you gave listening for its IPC ({sockets}), as an engine's worker does")
        return (f"No HTTP request: pid {pids} accepted no connection while recording; {why}: "
                f"record -p {hint.pid} (its children are followed).")
    skipped = recording.counter("io_skipped")
    ipc = unread_traffic.local_ipc_connections(recording)
    self_pairs = unread_traffic.self_pair_ends(recording)
    unread = unread_traffic.unread_connections(recording)
    if (ipc or self_pairs) and not unread and not any(c.role == "server" and c.family != "unix"
                                                      for c in connections):
        # An engine's API server between requests still talks to its workers, and an
        # asyncio server's threads still wake its loop: no sign of TLS or HTTP/2
        # (io_skipped counts those reads too).
        aside = (f"{ipc} Unix-socket IPC connection(s) between its processes aside" if ipc else
                 "its own wake-up socketpair aside")
        return (f"No connection was accepted by pid {pids} while recording: the server was idle "
                f"({aside}). Record while it serves traffic.")
    if connections or skipped:
        libraries = unread_traffic.unhooked_tls(recording)
        why = (f"encrypted (TLS) traffic through {', '.join(libraries)}, which inferprobe does not read"
               if libraries else
               "encrypted (TLS) traffic through a library inferprobe does not hook (it reads OpenSSL and "
               "Go's crypto/tls: `inferprobe doctor -p PID` says what it found), HTTP/2 or gRPC connections "
               "opened before the recorder attached (their preface went unseen: reconnect the clients), "
               "or not HTTP")
        also = f" ({ipc} more were Unix-socket IPC between processes)" if ipc else ""
        return (f"No HTTP/1.x request recognised, though {len(connections)} connection(s) were accepted, "
                f"{unread} moved bytes nothing recognised{also}, and "
                f"{skipped} reads and writes on connections without a request line were dropped in "
                f"the kernel: {why}.")
    return (f"No connection was accepted by pid {pids} while recording: the server was idle. "
            "Record while it serves traffic.")


def _listed(labels: Sequence[str], shown: int = 3) -> str:
    """A few socket labels and how many more: an engine's worker listens on a dozen."""
    more = f" and {len(labels) - shown} more" if len(labels) > shown else ""
    return ", ".join(labels[:shown]) + more
