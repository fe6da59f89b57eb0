"""Which of a process's Unix sockets are the two ends of one socketpair it holds.

asyncio's event loop keeps a socketpair to wake itself: call_soon_threadsafe()
writes a byte to one end, the loop reads it from the other. A server whose
worker threads hand results back to its loop (the demo, uvicorn's threadpool,
vLLM's API server) moves bytes on it all the time. Neither end carries HTTP,
so before this the report named them as IPC between processes of the host
(analyzers/unread_traffic.py); they are the process talking to itself.

The kernel gives each Unix socket's peer through sock_diag (UNIX_DIAG_PEER,
what `ss -xp` reads), asked through pyroute2's DiagSocket in the target's
network namespace: a socket whose peer inode is also one of the process's
own sockets is one end of such a pair. Only sockets open at attach are
looked at (sockets.py seeds them); a socketpair() made later is not a
tracked connection at all.
"""

from __future__ import annotations

import os
import socket

from pyroute2.netlink.exceptions import NetlinkError

from inferprobe.collector.tcp_state import in_netns


def _unix_peer_inodes() -> dict[int, int]:
    """inode -> its peer's inode for every connected Unix socket of this thread's namespace."""
    from pyroute2 import DiagSocket  # imported here, as tcp_state does: only when a target has Unix sockets

    peers: dict[int, int] = {}
    with DiagSocket() as diag:
        diag.bind()
        for msg in diag.get_sock_stats(family=socket.AF_UNIX):
            peer = msg.get_attr("UNIX_DIAG_PEER")
            if peer:
                peers[msg["udiag_ino"]] = peer
    return peers


def self_paired_fds(pid: int, sockets: dict[int, int]) -> set[int]:
    """The fds among sockets (fd -> inode, pid's) whose Unix peer is another of them;
    empty where the kernel's socket table cannot be read (then they stay IPC)."""
    if not sockets:
        return set()
    try:
        same_netns = os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
        peers = _unix_peer_inodes() if same_netns else in_netns(f"/proc/{pid}/ns/net", _unix_peer_inodes)
    except (OSError, NetlinkError):
        return set()
    inodes = set(sockets.values())
    return {fd for fd, inode in sockets.items() if peers.get(inode) in inodes}
