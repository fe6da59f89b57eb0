"""A pre-fork style server: the parent listens, a child forked *later* serves.

Prints "LISTENING host:port" when the listener is open, forks its worker
when it reads a line on stdin, then prints "FORKED <child pid>". The worker
answers each request on a keep-alive connection with a small Content-Length
response; plain sockets, so any syscall the kernel sees is the worker's.
"""

from __future__ import annotations

import os
import socket
import sys


def serve(listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        buf = b""
        while True:
            data = conn.recv(65536)
            if not data:
                break
            buf += data
            while b"\r\n\r\n" in buf:
                _, buf = buf.split(b"\r\n\r\n", 1)
                body = b'{"ok": true}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        conn.close()


def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"LISTENING 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    sys.stdin.readline()
    child = os.fork()
    if child == 0:
        serve(listener)
        os._exit(0)
    print(f"FORKED {child}", flush=True)
    try:
        os.waitpid(child, 0)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
