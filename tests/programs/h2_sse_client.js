// Streams CALLS SSE requests at once over one HTTP/2 connection (h2c, or
// with "tls" h2 over TLS, the test's self-signed certificate accepted) and
// prints one JSON line per call with its own CLOCK_MONOTONIC times: when the
// call began, when each "data:" event (not [DONE]) arrived, when it ended.
//
//   node h2_sse_client.js PORT CALLS TOKENS SECRET [tls] [finish]
//
// "finish" asks the server to end each stream as OpenAI does, a finish chunk
// (an empty delta: no token) and [DONE] in one write.
"use strict";
const http2 = require("http2");
const [port, calls, ntokens, secret, ...options] = process.argv.slice(2);
const tls = options.includes("tls") ? "tls" : undefined;
const finish = options.includes("finish");
const now = () => process.hrtime.bigint().toString();  // CLOCK_MONOTONIC on Linux

const session = tls === "tls"
  ? http2.connect(`https://127.0.0.1:${port}`, { rejectUnauthorized: false })
  : http2.connect(`http://127.0.0.1:${port}`);
let left = Number(calls);
for (let c = 0; c < Number(calls); c++) {
  const began = now();
  const req = session.request({ ":method": "POST", ":path": "/v1/chat/completions",
    "content-type": "application/json", "authorization": `Bearer ${secret}` });
  const received = [];
  let buffered = "";
  req.setEncoding("utf8");
  req.on("data", (text) => {
    const t = now();
    buffered += text;
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      if (event.startsWith("data: ") && event !== "data: [DONE]" && !event.includes('"delta":{}')) {
        received.push(t);
      }
    }
  });
  req.on("end", () => {
    console.log(JSON.stringify({ kind: "sse", start_ns: began, received_ns: received, end_ns: now() }));
    if (--left === 0) session.close();
  });
  req.end(JSON.stringify({ tokens: Number(ntokens), gap_ms: 15 + 5 * c, secret, finish }));
}
