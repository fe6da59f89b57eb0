// An HTTP/2 (h2c, prior knowledge) token server on Node's own http2 module
// (nghttp2): not Python, not grpcio.
//
//   POST /llm.Generator/Stream    gRPC server streaming, framed by hand: a
//                                 5-byte length prefix per message, then the
//                                 grpc-status trailer (what any gRPC client reads)
//   POST /llm.Generator/Complete  gRPC unary
//   POST /v1/chat/completions     SSE over HTTP/2: one "data:" event per token, then [DONE]
//                                 (with "finish": true after a finish chunk, in one frame)
//
// The request body (JSON, or one gRPC message holding JSON) says how many
// tokens and how far apart. Prints "LISTENING <port>".
//
//   node h2_token_server.js
"use strict";
const http2 = require("http2");

function grpcMessage(obj) {
  const body = Buffer.from(JSON.stringify(obj));
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(body.length, 1);
  return Buffer.concat([prefix, body]);
}

function tokens(stream, ask, send, done) {
  let i = 0;
  const next = () => {
    if (stream.destroyed) return;
    if (i >= ask.tokens) return done();
    send(i++);
    setTimeout(next, ask.gap_ms ?? 10);
  };
  setTimeout(next, ask.first_delay_ms ?? 20);
}

const server = http2.createServer();
server.on("stream", (stream, headers) => {
  const chunks = [];
  stream.on("data", (c) => chunks.push(c));
  stream.on("end", () => {
    const raw = Buffer.concat(chunks);
    const path = headers[":path"];
    if (path.startsWith("/llm.Generator/")) {
      const ask = JSON.parse(raw.subarray(5).toString() || "{}");
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      if (path === "/llm.Generator/Complete") {
        setTimeout(() => stream.end(grpcMessage({ text: "done" })), ask.first_delay_ms ?? 20);
      } else {
        tokens(stream, ask, (i) => stream.write(grpcMessage({ index: i, text: `token${i}` })), () => stream.end());
      }
    } else {
      const ask = JSON.parse(raw.toString() || "{}");
      stream.respond({ ":status": 200, "content-type": "text/event-stream" });
      // With "finish": true the stream ends as OpenAI's does, a finish chunk (an empty
      // delta) and the end marker written together: one DATA frame holding both.
      const last = ask.finish
        ? 'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        : "data: [DONE]\n\n";
      tokens(stream, ask,
        (i) => stream.write(`data: {"choices":[{"delta":{"content":"token${i}"}}]}\n\n`),
        () => stream.end(last));
    }
  });
});
server.listen(0, "127.0.0.1", () => console.log(`LISTENING ${server.address().port}`));
