// node_sse.js: the SSE server of bench_node_sse.py, as Node's http module
// serves a token stream. GET /stream answers a chunked text/event-stream of
// TOKENS OpenAI-style chunks and [DONE], each res.write() in a tick of its
// own, so that Node writes every chunk as writev([size, "\r\n", data,
// "\r\n"]) the way a streaming handler awaiting its model does. No delay
// between chunks: the benchmark drives it at saturation.
// Prints "LISTENING <port>". With TLS_CERT and TLS_KEY set (PEM files) it
// serves the same over HTTPS, through the OpenSSL linked into node.
"use strict";
const fs = require("fs");
const http = require("http");
const https = require("https");

const TOKENS = Number(process.env.TOKENS || 8);
const chunk = (i) => `data: {"choices":[{"delta":{"content":" t${i}"},"index":0}]}\n\n`;

const handler = (req, res) => {
  if (!req.url.startsWith("/stream")) {
    res.writeHead(404, { "Content-Length": "0" });
    res.end();
    return;
  }
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
  res.flushHeaders();
  let i = 0;
  const next = () => {
    if (i < TOKENS) {
      res.write(chunk(i++));
      setImmediate(next);
    } else {
      res.write("data: [DONE]\n\n");
      setImmediate(() => res.end());
    }
  };
  setImmediate(next);
};
const tls = process.env.TLS_CERT && process.env.TLS_KEY;
const server = tls
  ? https.createServer({ cert: fs.readFileSync(process.env.TLS_CERT), key: fs.readFileSync(process.env.TLS_KEY) },
    handler)
  : http.createServer(handler);
server.keepAliveTimeout = 60000;
server.listen(0, "127.0.0.1", () => {
  console.log(`LISTENING ${server.address().port}`);
});
