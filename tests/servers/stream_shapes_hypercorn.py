"""The FastAPI app of stream_shapes_fastapi.py served by hypercorn over
HTTP/2 on TLS (ALPN h2, through Python's ssl module), as a user serves an
ASGI app over HTTP/2.

Usage: stream_shapes_hypercorn.py LOG CERT KEY; prints the port.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from hypercorn.asyncio import serve
from hypercorn.config import Config


def main() -> None:
    os.environ["STREAM_SHAPES_LOG"] = sys.argv[1]
    from stream_shapes_fastapi import app  # reads STREAM_SHAPES_LOG at import

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.certfile, config.keyfile = sys.argv[2], sys.argv[3]
    config.alpn_protocols = ["h2"]
    config.keep_alive_timeout = 75   # past a recorder's start-up
    config.loglevel = "WARNING"
    print(port, flush=True)
    asyncio.run(serve(app, config))


if __name__ == "__main__":
    main()
