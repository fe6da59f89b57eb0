// Streamed Gemini calls through Google's official Gen AI SDK for Node (@google/genai), timed by the caller.
//
// Usage: node gemini_node_client.mjs BASE_URL CALLS TOKENS
// The SDK is found through NODE_PATH (tests/support/node.py installs it once, cached).
// The server is tests/servers/stream_shapes_fastapi.py, which speaks Gemini's
// streamGenerateContent?alt=sse: the token count and pacing go in extra body
// fields. Prints "ready", waits for a line on stdin (a tracer attaches
// meanwhile), then one JSON line per call: the CLOCK_MONOTONIC ns
// (process.hrtime, libuv's uv_hrtime) at which the call began and returned and
// at which each chunk with text reached the application. The prompt carries a
// marker and the API key (x-goog-api-key) a secret that must never reach the
// tracer's outputs. Certificates are not checked (NODE_TLS_REJECT_UNAUTHORIZED=0
// in the environment, for a self-signed server).
import { createRequire } from "node:module";
import { now, runTimedCalls } from "./timed_calls.mjs";

const require = createRequire(import.meta.url);
const { GoogleGenAI } = require("@google/genai");

const MARKER = "PRIVATE-MARKER-5e1d";
const SECRET = "sk-SECRET-b7c2e9";
const [baseUrl, calls, tokens] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];

// One client for every call, as applications keep theirs: its fetch pool reuses connections.
const client = new GoogleGenAI({ apiKey: SECRET, httpOptions: { baseUrl, apiVersion: "v1beta" } });

async function call(k) {
  const model = `gemini-test-${k % 2}`;
  const received = [];
  const began = now();
  const stream = await client.models.generateContentStream({
    model, contents: `${MARKER} say something ${k}`,
    config: { httpOptions: { extraBody: { tokens, prompt: `${MARKER} ${k}`, interval_ms: 3 } } },
  });
  for await (const chunk of stream) {
    if (chunk.text) received.push(now());
  }
  return { model: null, path: `/v1beta/models/${model}:streamGenerateContent`, received_ns: received,
           began_ns: began, returned_ns: now() };
}

await runTimedCalls(call, calls);
