"""An HTTP server that maps OpenSSL (it imports ssl) and serves plain HTTP on --port.

    ssl_linked_server.py --port 8000
        prints "LISTENING <port>" once listening; answers every GET with "ok".
Run with LD_LIBRARY_PATH naming a directory holding a copy of libssl.so.3, it
maps that copy: a file of its own that a test can hold probes on without
touching the system's libssl, which other tracers on the host may probe.
"""

from __future__ import annotations

import argparse
import http.server
import ssl  # noqa: F401 - mapping libssl is the point

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
print(f"LISTENING {server.server_address[1]}", flush=True)
server.serve_forever()
