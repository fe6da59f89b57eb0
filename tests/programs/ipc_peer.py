"""An engine's own IPC, as a Python process does it: binary frames over a Unix socket to a
peer process (argv[1] is its path). One connection opened now (before a recorder attaches);
on "new" a second one. On each other line of stdin: one 64-byte frame over every open
connection, each echo read; "close" closes the first."""

import socket
import sys

conns = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)]
conns[0].connect(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    line = line.strip()
    if line == "new":
        conns.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        conns[-1].connect(sys.argv[1])
    elif line == "close":
        conns.pop(0).close()
    else:
        for conn in conns:
            conn.sendall(b"\xab" * 64)
            conn.recv(64)
    print("ok", flush=True)
