"""A server that also calls out, as an engine exporting its own telemetry does (vLLM's
OTLP traces): each streamed completion it serves is followed by a POST /v1/traces to the
sink whose port is argv[1], over one keep-alive connection. Prints its own port."""

import http.client
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SINK_PORT = int(sys.argv[1])
_export_lock = threading.Lock()
_exporter = http.client.HTTPConnection("127.0.0.1", SINK_PORT, timeout=10)


def export_span() -> None:
    with _export_lock:
        _exporter.request("POST", "/v1/traces", body=b'{"resourceSpans": []}',
                          headers={"Content-Type": "application/json"})
        _exporter.getresponse().read()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(3):
            self.wfile.write(f'data: {{"choices":[{{"delta":{{"content":"t{i}"}}}}]}}\n\n'.encode())
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True
        export_span()

    def log_message(self, *args) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
