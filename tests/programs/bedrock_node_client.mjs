// Streamed Bedrock calls through the AWS SDK for JavaScript v3 (@aws-sdk/client-bedrock-runtime), timed by the caller.
//
// Usage: node bedrock_node_client.mjs BASE_URL CALLS TOKENS [--fail-first STATUS]
// The SDK is found through NODE_PATH (tests/support/node.py installs it once, cached).
// ConverseStream with the client's defaults: its NodeHttp2Handler speaks HTTP/2 (over
// Node's own OpenSSL), signs each request with SigV4 (Authorization, and
// x-amz-security-token from the session token), and reads AWS's binary event stream.
// The server is tests/servers/stream_shapes_hypercorn.py (HTTP/2): the token count and
// pacing go in additionalModelRequestFields, and --fail-first STATUS asks it to throttle
// each call's first attempt, which the SDK retries after its backoff. Prints "ready",
// waits for a line on stdin (a tracer attaches meanwhile), then one JSON line per call:
// the CLOCK_MONOTONIC ns at which the call began and returned and at which each content
// delta reached the application. The prompt carries a marker and the secret key and
// session token a secret that must never reach the tracer's outputs. Certificates are
// not checked (NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment, for a self-signed server).
import { createRequire } from "node:module";
import { now, runTimedCalls } from "./timed_calls.mjs";

const require = createRequire(import.meta.url);
const { BedrockRuntimeClient, ConverseStreamCommand } = require("@aws-sdk/client-bedrock-runtime");

const MARKER = "PRIVATE-MARKER-5e1d";
const SECRET = "sk-SECRET-b7c2e9";
const [baseUrl, calls, tokens] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const rest = process.argv.slice(5);
const extra = {};
if (rest.includes("--fail-first")) extra.fail_first_status = Number(rest[rest.indexOf("--fail-first") + 1]);

// One client for every call, as applications keep theirs: its HTTP/2 session is reused.
const client = new BedrockRuntimeClient({
  endpoint: baseUrl, region: "us-east-1", maxAttempts: 3,
  credentials: { accessKeyId: "AKIDEXAMPLE", secretAccessKey: SECRET, sessionToken: `SESSION-TOKEN-${SECRET}` },
});

async function call(k) {
  const model = `anthropic.claude-test-${k % 2}`;
  const received = [];
  const began = now();
  const answer = await client.send(new ConverseStreamCommand({
    modelId: model, messages: [{ role: "user", content: [{ text: `${MARKER} say something ${k}` }] }],
    additionalModelRequestFields: { tokens, prompt: `${MARKER} ${k}`, interval_ms: 3, ...extra },
  }));
  for await (const event of answer.stream) {
    if (event.contentBlockDelta) received.push(now());
  }
  return { model: null, path: `/model/${model}/converse-stream`, received_ns: received, began_ns: began,
           returned_ns: now() };
}

await runTimedCalls(call, calls);
