// A server that also calls out, as an engine exporting its own telemetry does (vLLM's
// OTLP traces): each streamed completion it serves is followed by a POST /v1/traces to the
// sink whose port is argv[2], over one keep-alive connection. Prints its own port.
"use strict";
const http = require("http");

const sinkPort = Number(process.argv[2]);
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

function exportSpan(done) {
  const body = JSON.stringify({ resourceSpans: [] });
  const req = http.request({ host: "127.0.0.1", port: sinkPort, path: "/v1/traces", method: "POST", agent,
                             headers: { "Content-Type": "application/json", "Content-Length": body.length } },
                           (res) => { res.resume(); res.on("end", done); });
  req.end(body);
}

const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, { "Content-Type": "text/event-stream" });
    let i = 0;
    const tick = () => {
      if (i < 3) {
        res.write(`data: {"choices":[{"delta":{"content":"t${i}"}}]}\n\n`);
        i += 1;
        setTimeout(tick, 2);
        return;
      }
      res.end("data: [DONE]\n\n");
      exportSpan(() => {});
    };
    tick();
  });
});
server.listen(0, "127.0.0.1", () => console.log(server.address().port));
