"""Which of a process's Unix sockets are the two ends of one socketpair it holds.

asyncio's event loop keeps a socketpair to wake itself: call_soon_threadsafe()
writes a byte to one end, the loop reads it from the other. A server whose
worker threads hand results back to its loop (the demo, uvicorn's threadpool,
vLLM's API server) moves bytes on it all the time. Neither end carries HTTP,
so before this the report named them as IPC between processes of the host
(analyzers/unread_traffic.py); they are the process talking to itself.

The kernel gives each Unix socket's peer through sock_diag (UNIX_DIAG_PEER,
what `ss -x` reads), asked in the target's network namespace: a socket whose
peer inode is also one of the process's own sockets is one end of such a
pair. Only sockets open at attach are looked at (sockets.py seeds them); a
socketpair() made later is not a tracked connection at all.

Why a hand-written netlink request and not pyroute2's DiagSocket (which
tcp_state.py uses for --network): importing pyroute2 costs the recorder about
19 MB of resident memory, and this runs at every attach to an asyncio
server. The request is one fixed struct and the answer one attribute.
"""

from __future__ import annotations

import os
import socket
import struct

from inferprobe.collector.processes.tcp_state import in_netns

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_PEER = 0x4
UNIX_DIAG_PEER = 2
ALL_STATES = 0xFFFFFFFF

NLMSG_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie[2]
UNIX_DIAG_MSG = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie[2]
RTATTR = struct.Struct("=HH")  # len, type


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _peers_in_message(body: bytes) -> tuple[int, int] | None:
    """(inode, peer inode) of one unix_diag_msg, where it names a peer."""
    inode = UNIX_DIAG_MSG.unpack_from(body)[4]
    offset = UNIX_DIAG_MSG.size
    while offset + RTATTR.size <= len(body):
        length, kind = RTATTR.unpack_from(body, offset)
        if length < RTATTR.size:
            break
        if kind == UNIX_DIAG_PEER and length >= RTATTR.size + 4:
            return inode, struct.unpack_from("=I", body, offset + RTATTR.size)[0]
        offset += _align4(length)
    return None


def _unix_peer_inodes() -> dict[int, int]:
    """inode -> its peer's inode for every connected Unix socket of this thread's namespace."""
    request = UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, ALL_STATES, 0, UDIAG_SHOW_PEER, 0xFFFFFFFF, 0xFFFFFFFF)
    header = NLMSG_HEADER.pack(NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY,
                               NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    peers: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.sendall(header + request)
        while True:
            data = nl.recv(65536)
            offset = 0
            while offset + NLMSG_HEADER.size <= len(data):
                length, kind = NLMSG_HEADER.unpack_from(data, offset)[:2]
                if kind == NLMSG_DONE:
                    return peers
                if kind == NLMSG_ERROR or length < NLMSG_HEADER.size:
                    raise OSError("sock_diag refused the Unix socket dump")
                found = _peers_in_message(data[offset + NLMSG_HEADER.size:offset + length])
                if found:
                    peers[found[0]] = found[1]
                offset += _align4(length)
            if not data:
                return peers


def self_paired_fds(pid: int, sockets: dict[int, int]) -> set[int]:
    """The fds among sockets (fd -> inode, pid's) whose Unix peer is another of them;
    empty where the kernel's socket table cannot be read (then they stay IPC)."""
    if not sockets:
        return set()
    try:
        same_netns = os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
        peers = _unix_peer_inodes() if same_netns else in_netns(f"/proc/{pid}/ns/net", _unix_peer_inodes)
    except OSError:
        return set()
    inodes = set(sockets.values())
    return {fd for fd, inode in sockets.items() if peers.get(inode) in inodes}
