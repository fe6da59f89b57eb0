// The LLM stream shapes on Node's own http module (chunked responses; Node
// writes each chunk as writev(size line, CRLF, data, CRLF)).
//
//   POST /v1/chat/completions  OpenAI: unnamed SSE events, a usage chunk, [DONE]
//   POST /v1/messages          Anthropic: named SSE events, content_block_delta tokens
//   POST /api/generate         Ollama: NDJSON lines, the last with "done": true
//
// The body is JSON: {"model", "prompt", "tokens", "interval_ms"}. Prints the
// port, then appends one JSON line per response to the log named by argv[2]:
// the client's port, the path, and the CLOCK_MONOTONIC ns (process.hrtime is
// CLOCK_MONOTONIC on Linux) taken just before each token write, and the one
// taken once that write has gone out (token_written_ns).
//
// TLS mode, as for stream_shapes.go: with STREAM_SHAPES_TLS_CERT and
// STREAM_SHAPES_TLS_KEY set (PEM files), the same handler is served by Node's
// https module, over the OpenSSL linked into the node binary.
"use strict";
const fs = require("fs");
const http = require("http");
const https = require("https");
const shapes = require("./stream_shapes_payloads.json");

const log = fs.openSync(process.argv[2], "a");
const now = () => Number(process.hrtime.bigint());
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function fill(template, vars) {
  return template.replace(/\{(\w+)\}/g, (_, k) => String(vars[k]));
}

async function stream(req, res, body) {
  const shape = shapes[req.url];
  if (!shape || req.method !== "POST") {
    res.writeHead(404, { "Content-Length": "0" });
    res.end();
    return;
  }
  const vars = { model: body.model, tokens: body.tokens, prompt_tokens: shape.prompt_tokens };
  res.writeHead(200, { "Content-Type": shape.content_type });
  const tokenNs = [];
  const writtenNs = [];
  for (const event of shape.before) res.write(fill(event, vars));
  for (let i = 0; i < body.tokens; i++) {
    await sleep(body.interval_ms);
    tokenNs.push(now());
    res.write(fill(shape.token, { ...vars, i, text: `${body.prompt.slice(0, 24)} ${i}` }));
    // A chunked write is corked and goes out from a later callback of this loop turn; setImmediate
    // runs after all of them (the check phase), so once that writev (or SSL_write) has returned:
    // the write's other bound.
    setImmediate(() => writtenNs.push(now()));
  }
  for (const event of shape.after) res.write(fill(event, vars));
  res.end();
  await new Promise((resolve) => setImmediate(resolve));
  fs.writeSync(log, JSON.stringify({
    peer_port: req.socket.remotePort, path: req.url, token_ns: tokenNs, token_written_ns: writtenNs,
  }) + "\n");
}

const handler = (req, res) => {
  const parts = [];
  req.on("data", (d) => parts.push(d));
  req.on("end", () => stream(req, res, JSON.parse(Buffer.concat(parts).toString())));
};
const [cert, key] = [process.env.STREAM_SHAPES_TLS_CERT, process.env.STREAM_SHAPES_TLS_KEY];
const server = cert && key
  ? https.createServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, handler)
  : http.createServer(handler);
server.keepAliveTimeout = 60000;
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`${server.address().port}\n`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
