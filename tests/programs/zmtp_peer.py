"""One end of an engine's ZeroMQ connection, as a Python process moves its bytes: a Unix
socket to a peer (argv[1] is its path), connected before a recorder attaches. Each line of
stdin is "send HEX" (one sendall of those bytes), "recv N" (exactly N bytes, read with
recv calls of at most N bytes each) or "reconnect" (the connection closed and a new one
made); each answered "ok"."""

import socket
import sys

conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    verb, _, arg = line.strip().partition(" ")
    if verb == "reconnect":
        conn.close()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(sys.argv[1])
    elif verb == "send":
        conn.sendall(bytes.fromhex(arg))
    else:
        left = int(arg)
        while left:
            left -= len(conn.recv(left))
    print("ok", flush=True)
