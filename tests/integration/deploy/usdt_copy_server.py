"""An HTTP server that fires inferprobe's USDT probes from a copy of the probe library.

    usdt_copy_server.py --port 8000 --extension /tmp/x/_usdt.cpython-311-x86_64-linux-gnu.so
        loads that file as inferprobe.probes._usdt (a server shipping its own build of
        the library), prints "LISTENING <port>", and for each GET fires request_start
        and request_end around an "ok" answer.
A file of its own lets a test hold probes on it without touching the repository's
build, which other tracers on the host may probe.
"""

from __future__ import annotations

import argparse
import http.server
import importlib.util
import itertools
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--extension", required=True)
args = parser.parse_args()

spec = importlib.util.spec_from_file_location("inferprobe.probes._usdt", args.extension)
assert spec is not None and spec.loader is not None
extension = importlib.util.module_from_spec(spec)
spec.loader.exec_module(extension)
sys.modules["inferprobe.probes._usdt"] = extension

from inferprobe.probes import usdt  # noqa: E402 - after the copy is in place

assert usdt.available, usdt.reason
ids = itertools.count(1)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        req = next(ids)
        usdt.request_start(req, 1, self.connection.fileno())
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        usdt.request_end(req, 1, 0)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
print(f"LISTENING {server.server_address[1]}", flush=True)
server.serve_forever()
