// Streamed chat completions through the official openai SDK for Node, timed by the caller.
//
// Usage: node openai_node_client.mjs BASE_URL CALLS TOKENS [--fail-first STATUS]
// The SDK is found through NODE_PATH (tests/support/node.py installs it once, cached).
// The server is tests/servers/stream_shapes_fastapi.py: the token count and
// pacing go in extra body fields, and --fail-first STATUS asks it to answer each
// call's first attempt with that status, which the SDK retries after its backoff.
// Prints "ready", waits for a line on stdin (a tracer attaches meanwhile), then one
// JSON line per call: the CLOCK_MONOTONIC ns (process.hrtime, libuv's uv_hrtime) at
// which the call began and returned and at which each content delta reached the
// application. The prompt carries a marker and the API key a secret that must
// never reach the tracer's outputs. Certificates are not checked
// (NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment, for a self-signed server).
import { createRequire } from "node:module";
import { now, runTimedCalls } from "./timed_calls.mjs";

const require = createRequire(import.meta.url);
const OpenAI = require("openai").default ?? require("openai");

const MARKER = "PRIVATE-MARKER-5e1d";
const SECRET = "sk-SECRET-b7c2e9";
const [baseUrl, calls, tokens] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const rest = process.argv.slice(5);
const extra = {};
if (rest.includes("--fail-first")) extra.fail_first_status = Number(rest[rest.indexOf("--fail-first") + 1]);

// One client for every call, as applications keep theirs: its fetch pool reuses connections.
const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: SECRET, maxRetries: 2 });

async function call(k) {
  const model = `gpt-test-${k % 2}`;
  const received = [];
  const began = now();
  const stream = await client.chat.completions.create({
    model, stream: true, messages: [{ role: "user", content: `${MARKER} say something ${k}` }],
    tokens, prompt: `${MARKER} ${k}`, interval_ms: 3, ...extra,
  });
  for await (const chunk of stream) {
    if (chunk.choices?.[0]?.delta?.content) received.push(now());
  }
  return { model, path: "/v1/chat/completions", received_ns: received, began_ns: began, returned_ns: now() };
}

await runTimedCalls(call, calls);
