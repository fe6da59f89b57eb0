"""Connections that moved bytes inferprobe could not read, said in one sentence.

A connection that never carried an HTTP/1.x request line nor the HTTP/2
preface, on a socket or in the plaintext of a hooked TLS library, is skipped
in the kernel; the socket probes count those that moved bytes anyway (at
close, COUNTER_CONNS_UNRECOGNISED, and at the stop for those still open).
They are usually TLS through a library inferprobe does not hook, or HTTP/2
and gRPC connections opened before the recorder attached (their preface was
before it): the report names them rather than leave a silent gap. Unix-domain
ones are counted apart (COUNTER_CONNS_LOCAL_IPC): they are processes of this
host talking, an engine's own IPC, and no sign of TLS or HTTP/2. The ends
of a socketpair one process holds both of (asyncio's self-pipe: its loop
woken by its own threads) are counted apart again (COUNTER_CONNS_SELF_PAIR):
the process talking to itself, said in no note. So are
connections a hooked TLS library read over that never carried plaintext
(COUNTER_CONNS_TLS_NO_PLAINTEXT: handshakes only, such as the connections a
pool opens ahead and never uses): nothing on them went unread.
"""

from __future__ import annotations

from inferprobe.collector.model.recording import Recording


def _closed_and_open(recording: Recording, counter: str, snapshot_key: str) -> int:
    """The kernel's count of such connections closed (or given up on) while recording,
    plus those still open at the stop (the sockets set's snapshot of its table)."""
    still_open = (recording.snapshots.get("sockets") or {}).get(snapshot_key, 0)
    return recording.counter(counter) + int(still_open)


def unread_connections(recording: Recording) -> int:
    """Closed and still-open connections that moved bytes nothing recognised."""
    return _closed_and_open(recording, "conns_unrecognised", "open_unrecognised")


def local_ipc_connections(recording: Recording) -> int:
    """Unix-domain connections (closed and still open) that moved bytes nothing recognised:
    processes of this host talking among themselves (an engine's API server and its
    EngineCore over ZMQ), counted apart so they are not taken for unhooked TLS."""
    return _closed_and_open(recording, "conns_local_ipc", "open_local_ipc")


def self_pair_ends(recording: Recording) -> int:
    """Ends of a socketpair a target holds both ends of (asyncio's self-pipe,
    collector/processes/unix_peers.py) that moved bytes: the process waking itself, neither IPC
    nor unread traffic."""
    return _closed_and_open(recording, "conns_self_pair", "open_self_pairs")


def tls_without_plaintext(recording: Recording) -> int:
    """TLS connections (closed and still open) a hooked library read over that carried no plaintext."""
    return _closed_and_open(recording, "conns_tls_no_plaintext", "open_tls_no_plaintext")


def local_ipc_sentence(recording: Recording) -> str | None:
    count = local_ipc_connections(recording)
    if not count:
        return None
    return (f"{count} Unix-socket connection(s) between processes of this host carried no HTTP (an engine's "
            "own IPC, such as vLLM's ZMQ between its API server and EngineCore): not followed.")


def unhooked_tls(recording: Recording) -> list[str]:
    """The TLS libraries the targets used that inferprobe does not read ("GnuTLS /usr/lib/...")."""
    found = (recording.snapshots.get("tls") or {}).get("unhooked", [])
    return sorted({f"{entry['library']} {entry['path']}" for entry in found})


def sentence(recording: Recording) -> str | None:
    count = unread_connections(recording)
    if not count:
        return None
    libraries = unhooked_tls(recording)
    hint = (f"TLS through {', '.join(libraries)}, which inferprobe does not read" if libraries
            else "TLS in a library not hooked? HTTP/2 or gRPC connections opened before attach? not HTTP?")
    return f"{count} connection(s) carried encrypted or unrecognised traffic ({hint})."
