// Bedrock's converse-stream on Node's own http2 module (nghttp2), in AWS's binary
// event stream, as the AWS SDK for JavaScript's default HTTP/2 handler calls it: not Python.
//
//   POST /model/<model id>/converse-stream   messageStart, a contentBlockDelta per
//                                            token, contentBlockStop, messageStop,
//                                            metadata (the usage)
//
// The body is converse's JSON; additionalModelRequestFields holds {"tokens",
// "prompt", "interval_ms"} and, with "fail_first_status", each call's first attempt
// (amz-sdk-request attempt=1) is throttled as Bedrock throttles: 429 and
// x-amzn-errortype ThrottlingException. Prints the port, then appends one JSON line
// per response to the log named by argv[2]: the client's port, the path, and the
// CLOCK_MONOTONIC ns (process.hrtime) just before each token's message is written
// and once that write has gone out (token_written_ns). With STREAM_SHAPES_TLS_CERT
// and STREAM_SHAPES_TLS_KEY set (PEM files) it serves h2 over TLS (ALPN), through
// the OpenSSL linked into node; else h2c with prior knowledge.
//
// The messages are framed as tests/support/aws_event_stream.py frames them (Bedrock's
// header order, both CRC32s, which the SDK checks).
"use strict";
const fs = require("fs");
const http2 = require("http2");
const zlib = require("zlib");

const log = fs.openSync(process.argv[2], "a");
const now = () => Number(process.hrtime.bigint());
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function message(eventType, payload) {
  const headers = Buffer.concat(Object.entries({
    ":event-type": eventType, ":content-type": "application/json", ":message-type": "event",
  }).map(([name, value]) => {
    const len = Buffer.alloc(2);
    len.writeUInt16BE(value.length);
    return Buffer.concat([Buffer.from([name.length]), Buffer.from(name), Buffer.from([7]), len, Buffer.from(value)]);
  }));
  const body = Buffer.from(JSON.stringify(payload));
  const prelude = Buffer.alloc(12);
  prelude.writeUInt32BE(12 + headers.length + body.length + 4, 0);
  prelude.writeUInt32BE(headers.length, 4);
  prelude.writeUInt32BE(zlib.crc32(prelude.subarray(0, 8)), 8);
  const withoutCrc = Buffer.concat([prelude, headers, body]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(zlib.crc32(withoutCrc));
  return Buffer.concat([withoutCrc, crc]);
}

async function converse(stream, headers, body) {
  const fields = body.additionalModelRequestFields || {};
  const peer = stream.session.socket.remotePort;
  const path = headers[":path"];
  if (fields.fail_first_status && /attempt=1;/.test(headers["amz-sdk-request"] || "attempt=1;")) {
    stream.respond({ ":status": 429, "content-type": "application/json",
                     "x-amzn-errortype": "ThrottlingException:http://internal.amazon.com/coral/" });
    stream.end(JSON.stringify({ message: "Too many requests, please wait before trying again." }));
    fs.writeSync(log, JSON.stringify({ peer_port: peer, path, status: 429 }) + "\n");
    return;
  }
  stream.respond({ ":status": 200, "content-type": "application/vnd.amazon.eventstream",
                   "x-amzn-requestid": "6f1c0d2e-test" });
  stream.write(message("messageStart", { role: "assistant" }));
  const tokenNs = [];
  const writtenNs = [];
  for (let i = 0; i < fields.tokens; i++) {
    await sleep(fields.interval_ms);
    tokenNs.push(now());
    stream.write(message("contentBlockDelta", {
      contentBlockIndex: 0, delta: { text: `${fields.prompt.slice(0, 24)} ${i}` } }));
    // nghttp2 sends the DATA frame from a later callback of this loop turn; setImmediate
    // runs after them (the check phase): the write's other bound.
    setImmediate(() => writtenNs.push(now()));
  }
  stream.write(message("contentBlockStop", { contentBlockIndex: 0 }));
  stream.write(message("messageStop", { stopReason: "end_turn" }));
  stream.end(message("metadata", { usage: { inputTokens: 7, outputTokens: fields.tokens,
                                            totalTokens: 7 + fields.tokens }, metrics: { latencyMs: 42 } }));
  await new Promise((resolve) => setImmediate(resolve));
  fs.writeSync(log, JSON.stringify({ peer_port: peer, path, token_ns: tokenNs, token_written_ns: writtenNs }) + "\n");
}

const [cert, key] = [process.env.STREAM_SHAPES_TLS_CERT, process.env.STREAM_SHAPES_TLS_KEY];
const server = cert && key
  ? http2.createSecureServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) })
  : http2.createServer();
server.on("stream", (stream, headers) => {
  const parts = [];
  stream.on("data", (d) => parts.push(d));
  stream.on("end", () => {
    if (!/^\/model\/[^/]+\/converse-stream$/.test(headers[":path"])) {
      stream.respond({ ":status": 404 });
      stream.end();
      return;
    }
    converse(stream, headers, JSON.parse(Buffer.concat(parts).toString()));
  });
});
server.listen(0, "127.0.0.1", () => process.stdout.write(`${server.address().port}\n`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
